# Serves Sidekiq 6.4.1's Web UI (Sidekiq::Web) in-process with Rack::MockRequest against the
# Redis in REDIS_URL and makes the requests named on the command line, in order:
#
#   ruby web_ui.rb "GET /" "GET /busy" "GET /retries/<score>-<jid>" \
#                  "POST /retries/<score>-<jid> retry=Retry+Now" ...
#
# Prints one line of JSON: a list of {method, path, status, location, body, error}.
# The UI's CSRF protection needs a Rack session: one session hash is shared by every request,
# and a POST carries the authenticity_token of the last page fetched. The UI rotates that
# token on every POST, so, as a browser does, a POST's redirect is followed (a GET whose
# status is reported as "followed") and the page it lands on gives the next token.
# An exception inside the UI is reported as status 500 with its message and backtrace.
require "json"
require "uri"
require "rack"
require "rack/mock"
require "sidekiq"
require "sidekiq/api"
require "sidekiq/web"

session = {}
app = Sidekiq::Web.new
mock = Rack::MockRequest.new(app)
token = nil

# One request; returns the response and its body, and remembers the page's token.
fetch = lambda do |method, path, form|
  env = {"rack.session" => session, "REMOTE_ADDR" => "127.0.0.1"}
  if method == "POST"
    abort "web_ui.rb: POST #{path} before any page gave an authenticity_token" unless token
    env[:input] = [form, "authenticity_token=#{Rack::Utils.escape(token)}"].compact.join("&")
    env["CONTENT_TYPE"] = "application/x-www-form-urlencoded"
  end
  response = mock.request(method, path, env)
  body = response.body.dup.force_encoding(Encoding::UTF_8).scrub
  found = body[/name='authenticity_token' value='([^']+)'/, 1]
  token = found if found
  [response, body]
end

results = ARGV.map do |request|
  method, path, form = request.split(" ", 3)
  abort "web_ui.rb: bad request #{request.inspect}" unless %w[GET POST].include?(method) && path
  begin
    response, body = fetch.call(method, path, form)
    followed = nil
    if method == "POST" && response.redirect? && response.location
      followed, = fetch.call("GET", URI(response.location).request_uri, nil)
    end
    {
      "method" => method, "path" => path, "status" => response.status,
      "location" => response.location, "followed" => followed&.status, "body" => body,
      "error" => nil,
    }
  rescue StandardError, ScriptError => e
    {
      "method" => method, "path" => path, "status" => 500, "location" => nil, "body" => "",
      "error" => "#{e.class}: #{e.message}\n#{e.backtrace.first(15).join("\n")}",
    }
  end
end
puts JSON.generate(results)
