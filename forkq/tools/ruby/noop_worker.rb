# The Ruby side of `forkq bench --sidekiq`: a no-op Sidekiq worker.
require "sidekiq"

# Same log level as the forkq side of the benchmark (warning): no per-job start/done lines.
Sidekiq.logger.level = Logger::WARN

class ForkqBenchNoop
  include Sidekiq::Worker

  def perform(*_args); end
end
