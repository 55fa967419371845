# Moves the first entry of the retry set to ARGV[0] (epoch seconds) with Sidekiq's API,
# which finds the member by re-generating its JSON (SortedEntry#reschedule, ZINCRBY).
require "sidekiq/api"

entry = Sidekiq::RetrySet.new.first
abort "the retry set is empty" unless entry
entry.reschedule(Float(ARGV.fetch(0)))
puts entry.jid
