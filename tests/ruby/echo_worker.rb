# A Ruby-only Sidekiq worker for tests/test_sidekiq_interop.py:
#   sidekiq -r ./tests/ruby/echo_worker.rb -q rubyq
# Each run LPUSHes "word:n:jid" to the list test:rubyecho.
require "sidekiq"

class RubyEcho
  include Sidekiq::Worker

  def perform(word, n)
    Sidekiq.redis { |conn| conn.lpush("test:rubyecho", "#{word}:#{n}:#{jid}") }
  end
end
