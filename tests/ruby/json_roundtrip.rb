# Reads one JSON document per line on stdin and writes JSON.generate of it per line.
# Used by tests/test_sidekiq_interop.py to compare forkq.wirejson with Ruby's json gem.
require "json"

$stdin.set_encoding(Encoding::UTF_8)
$stdout.set_encoding(Encoding::UTF_8)
$stdin.each_line do |line|
  $stdout.write(JSON.generate(JSON.parse(line)), "\n")
end
