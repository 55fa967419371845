# `forkq bench --sidekiq`: how fast Sidekiq's own Ruby client enqueues.
#
# ruby bench_enqueue.rb JOBS QUEUE CHUNK   (REDIS_URL names the server)
# Pushes JOBS jobs of ForkqBenchWork (args [i], retry false) to QUEUE with
# Sidekiq::Client.push one by one, deletes the queue, then again with
# Sidekiq::Client.push_bulk in chunks of CHUNK, deletes the queue, and prints
# {"one_by_one": jobs/s, "bulk": jobs/s} as JSON on stdout.
require "json"
require "sidekiq"

Sidekiq.logger.level = Logger::WARN
# redis-rb 4.8 (Debian's) warns on stderr about Sidekiq 6.4.1's pipelined calls on every
# push; the warning is not Sidekiq's work, so it is silenced as a deployment would.
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

jobs = Integer(ARGV.fetch(0))
queue = ARGV.fetch(1)
chunk = Integer(ARGV.fetch(2))
item = { "class" => "ForkqBenchWork", "queue" => queue, "retry" => false }

def clock
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

def drop(queue)
  Sidekiq.redis { |conn| conn.del("queue:#{queue}") }
end

drop(queue) # also opens the connection before the clock starts

started = clock
jobs.times { |i| Sidekiq::Client.push(item.merge("args" => [i])) }
one_by_one = jobs / (clock - started)
drop(queue)

started = clock
(0...jobs).each_slice(chunk) do |slice|
  Sidekiq::Client.push_bulk(item.merge("args" => slice.map { |i| [i] }))
end
bulk = jobs / (clock - started)
drop(queue)

puts JSON.generate({ "one_by_one" => one_by_one, "bulk" => bulk })
