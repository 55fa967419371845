# Enqueues two HardWorker jobs the two usual Ruby ways and prints their jids, one a line.
require "sidekiq"

class HardWorker
  include Sidekiq::Worker
end

puts Sidekiq::Client.push("class" => "HardWorker", "args" => ["bob", 5])
puts HardWorker.perform_async("alice", 7)
