# What Sidekiq's Ruby API sees of the running processes, as one line of JSON:
#   {"processes": [{identity, pid, hostname, tag, queues, concurrency, labels, busy,
#                   stopping, beat}...],
#    "total_concurrency": n, "workers_size": n, "leader": identity or "",
#    "workers": [{process, thread, queue, run_at, payload_type, class, jid, queue_in_payload}...]}
#
#   ruby process_api.rb                  prints the view
#   ruby process_api.rb quiet IDENTITY   finds IDENTITY in ProcessSet and calls quiet! on it
#   ruby process_api.rb stop IDENTITY    ... stop! (prints {"signalled": IDENTITY})
#
# The Redis server comes from REDIS_URL. Used by tests/test_sidekiq_interop.py.
require "json"
require "sidekiq"
require "sidekiq/api"

def view
  processes = Sidekiq::ProcessSet.new.map do |process|
    {
      "identity" => process.identity,
      "pid" => process["pid"],
      "hostname" => process["hostname"],
      "tag" => process.tag,
      "queues" => process.queues,
      "concurrency" => process["concurrency"],
      "labels" => process.labels,
      "busy" => process["busy"],
      "stopping" => process.stopping?,
      "beat" => process["beat"],
    }
  end
  workers = Sidekiq::Workers.new.map do |process_id, thread_id, work|
    payload = work["payload"]
    {
      "process" => process_id,
      "thread" => thread_id,
      "queue" => work["queue"],
      "run_at" => work["run_at"],
      "payload_type" => payload.class.name,
      "class" => payload.is_a?(Hash) ? payload["class"] : nil,
      "jid" => payload.is_a?(Hash) ? payload["jid"] : nil,
      "queue_in_payload" => payload.is_a?(Hash) ? payload["queue"] : nil,
    }
  end
  {
    "processes" => processes,
    "total_concurrency" => Sidekiq::ProcessSet.new(false).total_concurrency,
    "workers_size" => Sidekiq::Workers.new.size,
    "workers" => workers,
    "leader" => Sidekiq::ProcessSet.new(false).leader,
  }
end

command, identity = ARGV
case command
when nil, "list"
  puts JSON.generate(view)
when "quiet", "stop"
  abort "usage: process_api.rb #{command} IDENTITY" unless identity
  process = Sidekiq::ProcessSet.new.find { |p| p.identity == identity }
  abort "#{identity} is not in Sidekiq::ProcessSet" unless process
  command == "quiet" ? process.quiet! : process.stop!
  puts JSON.generate("signalled" => process.identity)
else
  abort "unknown command #{command.inspect}"
end
