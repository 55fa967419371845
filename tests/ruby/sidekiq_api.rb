# Sidekiq 6.4.1's own Ruby API (sidekiq/api) against the Redis in REDIS_URL, as a Sidekiq
# user drives it; used by tests/test_sidekiq_api.py on data a live forkq daemon wrote.
# Every command prints one line of JSON; a broken expectation aborts with the reason.
#
#   ruby sidekiq_api.rb read
#       everything the API shows: Stats (+ History, Queues), Queue.all with every JobRecord,
#       ScheduledSet / RetrySet / DeadSet with every SortedEntry, ProcessSet (+ leader,
#       total_concurrency), Workers. Each record is also looked up again with find_job.
#   ruby sidekiq_api.rb act SET JID ACTION [EPOCH]
#       SET is schedule, retry or dead; ACTION is retry, add_to_queue, delete, kill or
#       reschedule (to EPOCH) on the entry find_job(JID) returns.
#   ruby sidekiq_api.rb queue-delete QUEUE JID     JobRecord#delete
#   ruby sidekiq_api.rb queue-kill QUEUE JID       JobRecord#delete, then DeadSet#kill(raw job)
#   ruby sidekiq_api.rb clear queue:NAME|schedule|retry|dead
require "json"
require "sidekiq"
require "sidekiq/api"

def expect(ok, message)
  abort "sidekiq_api.rb: #{message}" unless ok
end

def seconds(value, what)
  return nil if value.nil?
  expect(value.is_a?(Time), "#{what} is a #{value.class}, not a Time")
  value.to_f
end

def epoch_field(job, name)
  value = job[name]
  return nil if value.nil?
  expect(value.is_a?(Numeric), "#{name} of #{job.jid} is #{value.inspect}, not a number")
  Time.at(value).utc.to_f
end

# A JobRecord (queue job) as JSON.
def record(job)
  {
    "jid" => job.jid,
    "class" => job.klass,
    "display_class" => job.display_class,
    "args" => job.args,
    "display_args" => job.display_args,
    "queue" => job.queue,
    "created_at" => seconds(job.created_at, "created_at of #{job.jid}"),
    "enqueued_at" => seconds(job.enqueued_at, "enqueued_at of #{job.jid}"),
    "latency" => job.latency,
    "tags" => job.tags,
    "retry" => job["retry"],
    "raw" => job.value,
  }
end

# A SortedEntry (scheduled, retry or dead job) as JSON.
def entry(job)
  backtrace = job.error_backtrace
  expect(backtrace.nil? || (backtrace.is_a?(Array) && backtrace.all?(String)),
         "error_backtrace of #{job.jid} decodes to #{backtrace.inspect}")
  record(job).merge(
    "score" => job.score,
    "at" => seconds(job.at, "at of #{job.jid}"),
    "error" => job.error?,
    "error_class" => job["error_class"],
    "error_message" => job["error_message"],
    "retry_count" => job["retry_count"],
    "failed_at" => epoch_field(job, "failed_at"),
    "retried_at" => epoch_field(job, "retried_at"),
    "error_backtrace" => backtrace,
  )
end

SETS = {
  "schedule" => Sidekiq::ScheduledSet,
  "retry" => Sidekiq::RetrySet,
  "dead" => Sidekiq::DeadSet,
}.freeze

def read_set(name)
  set = SETS.fetch(name).new
  entries = set.map { |job| entry(job) }
  expect(set.size == entries.size, "#{name}: size #{set.size} but each gave #{entries.size}")
  entries.each do |job|
    found = set.find_job(job["jid"])
    expect(found, "#{name}: find_job(#{job["jid"]}) found nothing")
    expect(found.value == job["raw"] && found.score == job["score"],
           "#{name}: find_job(#{job["jid"]}) found another entry: #{found.value}")
    fetched = set.fetch(job["score"], job["jid"])
    expect(fetched.size == 1 && fetched.first.value == job["raw"],
           "#{name}: fetch(#{job["score"]}, #{job["jid"]}) gave #{fetched.map(&:value)}")
  end
  {"size" => set.size, "entries" => entries}
end

def read_queue(queue)
  jobs = queue.map { |job| record(job) }
  expect(queue.size == jobs.size, "queue #{queue.name}: size #{queue.size}, each gave #{jobs.size}")
  jobs.each do |job|
    found = queue.find_job(job["jid"])
    expect(found && found.value == job["raw"], "queue #{queue.name}: find_job(#{job["jid"]})")
  end
  {"name" => queue.name, "size" => queue.size, "latency" => queue.latency, "jobs" => jobs}
end

def read_processes
  set = Sidekiq::ProcessSet.new
  processes = set.map do |process|
    {
      "identity" => process.identity,
      "hostname" => process["hostname"],
      "pid" => process["pid"],
      "tag" => process.tag,
      "labels" => process.labels,
      "queues" => process.queues,
      "concurrency" => process["concurrency"],
      "busy" => process["busy"],
      "beat" => process["beat"],
      "quiet" => process["quiet"],
      "stopping" => process.stopping?,
      "rss" => process["rss"],
      "started_at" => Time.at(process["started_at"]).to_f,
    }
  end
  {
    "size" => set.size,
    "processes" => processes,
    "total_concurrency" => set.total_concurrency,
    "leader" => set.leader,
  }
end

def read_workers
  workers = Sidekiq::Workers.new
  list = workers.map do |process, thread, work|
    payload = work["payload"]
    expect(payload.is_a?(Hash), "Workers: the payload of #{process} #{thread} is #{payload.class}")
    {
      "process" => process,
      "thread" => thread,
      "queue" => work["queue"],
      "run_at" => work["run_at"],
      "jid" => payload["jid"],
      "class" => payload["class"],
      "args" => payload["args"],
    }
  end
  {"size" => workers.size, "workers" => list}
end

def read_stats
  stats = Sidekiq::Stats.new
  history = Sidekiq::Stats::History.new(2)
  {
    "processed" => stats.processed,
    "failed" => stats.failed,
    "scheduled_size" => stats.scheduled_size,
    "retry_size" => stats.retry_size,
    "dead_size" => stats.dead_size,
    "processes_size" => stats.processes_size,
    "enqueued" => stats.enqueued,
    "workers_size" => stats.workers_size,
    "queues" => stats.queues,
    "default_queue_latency" => stats.default_queue_latency,
    "history_processed" => history.processed,
    "history_failed" => history.failed,
  }
end

def read
  {
    "stats" => read_stats,
    "queues" => Sidekiq::Queue.all.map { |queue| read_queue(queue) },
    "schedule" => read_set("schedule"),
    "retry" => read_set("retry"),
    "dead" => read_set("dead"),
    "process_set" => read_processes,
    "workers" => read_workers,
  }
end

# When an entry's job last failed (retried_at, else failed_at; 0 for none), in seconds.
def failed_time(entry)
  [entry.item["retried_at"], entry.item["failed_at"]].compact.map { |t| Float(t) }.max || 0.0
end

def with_jid(set, jid)
  set.select { |job| job.jid == jid }
end

def act(set_name, jid, action, arg)
  set = SETS.fetch(set_name) { abort "unknown set #{set_name.inspect}" }.new
  job = set.find_job(jid)
  expect(job, "#{set_name}: find_job(#{jid}) found nothing")
  before = entry(job)
  result =
    case action
    when "retry" then job.retry
    when "add_to_queue" then job.add_to_queue
    when "delete" then job.delete
    when "kill" then job.kill
    when "reschedule" then job.reschedule(Float(arg))
    else abort "unknown action #{action.inspect}"
    end
  after = with_jid(SETS.fetch(set_name).new, jid)
  dead = with_jid(Sidekiq::DeadSet.new, jid)
  case action
  when "reschedule"
    # ZINCRBY finds the member by JSON.generate(parsed entry): bytes that differ from what is
    # in Redis leave the entry where it was and add a second one, scored by the delta.
    listing = after.map { |e| [e.score, e.value] }.inspect
    stale = after.select { |e| e.score == job.score }
    expect(stale.empty?, "reschedule left #{jid} at its old score #{job.score} in #{set_name}: " \
                         "JSON.generate of the entry differs from its bytes; entries: #{listing}")
    # a due target may be moved on by the scheduler at once; a future one must stay, once
    if Float(arg) > Time.now.to_f + 5
      expect(after.size == 1, "reschedule left #{after.size} entries for #{jid} in " \
                              "#{set_name}: #{listing}")
      expect((after.first.score - Float(arg)).abs < 0.01,
             "reschedule moved #{jid} to #{after.first.score}, not #{arg}")
    end
  when "kill"
    expect(after.empty? || set_name == "dead", "kill left #{jid} in #{set_name}")
    expect(dead.size == 1, "kill: #{dead.size} entries for #{jid} in the dead set")
  when "delete"
    expect(after.empty?, "delete left #{after.size} entries for #{jid} in #{set_name}")
  else
    # retry / add_to_queue: the entry must have left. The live daemon may already have run
    # the job and filed its new failure under the same jid (a ms later): such an entry has
    # other bytes and a strictly later failure time; anything else is the entry left behind.
    left = after.reject { |e| e.value != job.value && failed_time(e) > failed_time(job) }
    expect(left.empty?, "#{action} left #{left.size} entries for #{jid} in #{set_name}: " \
                        "#{left.map(&:value).inspect}")
  end
  {
    "action" => action,
    "result" => result,
    "before" => before,
    "after" => after.map { |e| entry(e) },
    "dead" => dead.map { |e| entry(e) },
  }
end

def queue_job(name, jid)
  queue = Sidekiq::Queue.new(name)
  job = queue.find_job(jid)
  expect(job, "queue #{name}: find_job(#{jid}) found nothing")
  [queue, job]
end

def queue_delete(name, jid)
  queue, job = queue_job(name, jid)
  before = record(job)
  deleted = job.delete
  expect(deleted == true, "JobRecord#delete of #{jid} returned #{deleted.inspect}")
  expect(queue.find_job(jid).nil?, "JobRecord#delete left #{jid} in queue #{name}")
  {"deleted" => before, "size" => queue.size}
end

def queue_kill(name, jid)
  queue, job = queue_job(name, jid)
  before = record(job)
  expect(job.delete == true, "JobRecord#delete of #{jid} failed")
  killed = Sidekiq::DeadSet.new.kill(job.value)
  dead = Sidekiq::DeadSet.new.find_job(jid)
  expect(dead && dead.value == job.value, "DeadSet#kill: #{jid} is not in the dead set as it was")
  {"killed" => before, "result" => killed, "dead" => entry(dead), "size" => queue.size}
end

def clear(what)
  if what.start_with?("queue:")
    queue = Sidekiq::Queue.new(what.delete_prefix("queue:"))
    before = queue.size
    queue.clear
    listed = Sidekiq::Queue.all.map(&:name)
    expect(queue.size.zero?, "Queue#clear left #{queue.size} jobs in #{queue.name}")
    expect(!listed.include?(queue.name), "Queue#clear left #{queue.name} in Queue.all")
    {"before" => before, "after" => queue.size, "queues" => listed}
  else
    set = SETS.fetch(what) { abort "unknown set #{what.inspect}" }.new
    before = set.size
    set.clear
    after = SETS.fetch(what).new.size
    expect(after.zero?, "#{what}: clear left #{after} entries")
    {"before" => before, "after" => after}
  end
end

USAGE = "usage: sidekiq_api.rb read | act SET JID ACTION [EPOCH] | queue-delete QUEUE JID | " \
        "queue-kill QUEUE JID | clear queue:NAME|schedule|retry|dead"

# The first n arguments after the command (aborts with the usage when some are missing).
def arguments(rest, n)
  abort USAGE if rest.size < n
  rest.first(n)
end

command, *rest = ARGV
output =
  case command
  when "read" then read
  when "act" then act(*arguments(rest, 3), rest[3])
  when "queue-delete" then queue_delete(*arguments(rest, 2))
  when "queue-kill" then queue_kill(*arguments(rest, 2))
  when "clear" then clear(*arguments(rest, 1))
  else abort USAGE
  end
puts JSON.generate(output)
