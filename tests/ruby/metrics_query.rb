# Reads job metrics from the Redis in REDIS_URL the way Sidekiq 7.x's and 8.x's Metrics tab
# does, for the minute of the epoch time NOW and the job class CLASS:
#
#   ruby metrics_query.rb NOW CLASS
#
# Prints one line of JSON: {"7": {"for_job", "top_jobs", "hist"}, "8": {... "ten_minutes"}},
# each "for_job" / "top_jobs" / "ten_minutes" a hash {"p", "f", "ms"} of the counts found for
# CLASS, "hist" the 26 histogram counters in bucket order (Sidekiq reverses them to draw).
#
# Only Sidekiq 6.4.1 (no metrics) installs here, so this mirrors the readers of the two
# versions rather than loading them: the same key formats, fed to Ruby's own strftime, the
# same commands through redis-rb. Sources (github.com/sidekiq/sidekiq):
#   7.x  lib/sidekiq/metrics/query.rb   v7.3.10 L33 (top_jobs key: "j|#{time.strftime("%Y%m%d")}|
#        #{time.hour}:#{time.min}"), L44 (fields split on "|": class, metric), L63-64 (for_job:
#        HMGET key "<class>|ms", "|p", "|f"); shared.rb v7.3.10 L85-87 (histogram key
#        "#{klass}-#{now.utc.strftime("%d-%H:%-M")}", BITFIELD_RO GET u16 #0..#25).
#        7.0.0 reads the same keys (query.rb L30/L59, shared.rb L74-75).
#   8.x  lib/sidekiq/metrics/query.rb   v8.1.7 L24 (minutely key strftime("j|%y%m%d|%-H:%M")),
#        L26-29 (10-minute key: "j|%y%m%d|%-H:" + first digit of the minute, "0" below 10),
#        L65 (split on "|"), L94 (for_job HMGET); shared.rb v8.1.7 L88-90 (histogram key
#        "h|#{klass}-#{now.utc.strftime("%-d-%-H:%-M")}", BITFIELD_RO).
require "json"
require "redis"

now = Time.at(Float(ARGV.fetch(0))).utc
klass = ARGV.fetch(1)
redis = Redis.new(url: ENV.fetch("REDIS_URL"))
fetch = (0..25).flat_map { |i| ["GET", "u16", "##{i}"] }

for_job = lambda do |key|
  ms, p, f = redis.hmget(key, "#{klass}|ms", "#{klass}|p", "#{klass}|f")
  {"p" => p.to_i, "f" => f.to_i, "ms" => ms.to_i}
end

top_jobs = lambda do |key|
  totals = Hash.new(0)
  redis.hgetall(key).each do |k, v|
    kls, metric = k.split("|")
    totals[metric] += v.to_i if kls == klass
  end
  {"p" => totals["p"], "f" => totals["f"], "ms" => totals["ms"]}
end

v7_key = "j|#{now.strftime("%Y%m%d")}|#{now.hour}:#{now.min}"
v8_key = now.strftime("j|%y%m%d|%-H:%M")
mins = (now.min < 10) ? "0" : now.min.to_s[0]
v8_ten = now.strftime("j|%y%m%d|%-H:#{mins}")
v7_hist = "#{klass}-#{now.strftime("%d-%H:%-M")}"
v8_hist = "h|#{klass}-#{now.strftime("%-d-%-H:%-M")}"

puts JSON.generate({
  "keys" => [v7_key, v8_key, v8_ten, v7_hist, v8_hist],
  "7" => {"for_job" => for_job.call(v7_key), "top_jobs" => top_jobs.call(v7_key),
          "hist" => redis.call(:bitfield_ro, v7_hist, *fetch)},
  "8" => {"for_job" => for_job.call(v8_key), "top_jobs" => top_jobs.call(v8_key),
          "ten_minutes" => for_job.call(v8_ten),
          "hist" => redis.call(:bitfield_ro, v8_hist, *fetch)},
})
