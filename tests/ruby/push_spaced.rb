# Push ARGV[0] "Lag" jobs to queue ARGV[1] one at a time, ARGV[2] seconds apart (the
# Ruby client sets enqueued_at), so each push meets an idle forkq daemon.
require "sidekiq"

count, queue, gap = ARGV[0].to_i, ARGV[1], ARGV[2].to_f
count.times do
  Sidekiq::Client.push("class" => "Lag", "args" => [], "queue" => queue)
  sleep gap
end
