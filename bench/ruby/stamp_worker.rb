# The Ruby side of `python bench/scheduled.py --sidekiq`: records when a scheduled job started.
require "sidekiq"

Sidekiq.logger.level = Logger::WARN

class ForkqBenchStamp
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(due)
    now = Time.now.to_f
    Sidekiq.redis do |conn|
      conn.rpush("forkq:bench:stamps", JSON.generate({"jid" => jid, "due" => due, "at" => now}))
    end
  end
end
