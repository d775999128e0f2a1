-- Requests cycling over KEYS keys: <url path>k0, k1, ..., k<KEYS-1>, k0, ...
--
--   wrk ... -s keys.lua http://127.0.0.1:PORT/objects/put/ -- METHOD KEYS [TOKEN [prime CONNS]]
--
-- METHOD  PUT (16-byte body) or GET (no body).
-- KEYS    number of distinct keys (default 10000).
-- TOKEN   X-Fencing-Token value sent on every request (omit or "-" for none).
--         A constant token is the common case: a lock holder writing many
--         times with the token it holds, equal to the key's mark.
-- prime   exit once every key has been answered (KEYS + CONNS responses: at
--         most CONNS are in flight), so each key has its mark before
--         measuring. Prints the same result line, without latencies.
--
-- All requests are built once in init(); request() only picks the next one.
-- Use with -t1 (one Lua state, one sequence).

dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local reqs = {}
local keys = 10000
local n = 0

function init(args)
   local method = args[1] or "PUT"
   keys = tonumber(args[2]) or 10000
   local token = args[3]
   local headers = {}
   if token and token ~= "-" then
      headers["X-Fencing-Token"] = token
   end
   local body = nil
   if method ~= "GET" and method ~= "HEAD" then
      body = BODY
      headers["Content-Type"] = "application/octet-stream"
   end
   for i = 0, keys - 1 do
      reqs[i] = wrk.format(method, wrk.path .. "k" .. i, headers, body)
   end
   if args[4] == "prime" then
      -- wrk has no way to end a run early (thread:stop() only idles the thread
      -- until -d is over), so the priming run reports and exits by itself.
      local answered, bad, started = 0, 0, os.time()
      local target = keys + (tonumber(args[5]) or 1024)
      response = function(status, headers, body)
         answered = answered + 1
         if status > 399 then
            bad = bad + 1
         end
         if answered == target then
            io.write(string.format(
               "WRK_RESULT requests=%d duration_us=%d p50_us=0 p99_us=0 mean_us=0" ..
               " connect=0 read=0 write=0 status=%d timeout=0\n",
               answered, math.max(1, os.time() - started) * 1000000, bad))
            io.stdout:flush()
            os.exit(0)
         end
      end
   end
end

function request()
   local r = reqs[n]
   n = n + 1
   if n == keys then
      n = 0
   end
   return r
end
