# The Ruby side of `forkq bench --sidekiq`: the same job body as forkq.tools.bench_jobs'.
#
# perform(n, pushed = nil): one pipelined INCR forkq:bench:done + SETBIT forkq:bench:bits n 1
# (no transaction); with `pushed` (the pusher's clock just before the push, epoch seconds)
# it also RPUSHes now - pushed to forkq:bench:latency in the same pipeline.
require "sidekiq"

# Same log level as the forkq side of the benchmark (warning): no per-job start/done lines.
Sidekiq.logger.level = Logger::WARN
# redis-rb 4.8 (Debian's) warns on stderr about Sidekiq 6.4.1's pipelined calls on every
# push; the warning is not Sidekiq's work, so it is silenced as a deployment would.
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

class ForkqBenchWork
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(n, pushed = nil)
    now = Time.now.to_f
    Sidekiq.redis do |conn|
      conn.pipelined do |pipe|
        pipe.incr("forkq:bench:done")
        pipe.setbit("forkq:bench:bits", n, 1)
        pipe.rpush("forkq:bench:latency", (now - pushed).to_s) if pushed
      end
    end
  end
end
