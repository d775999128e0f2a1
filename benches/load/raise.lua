-- Every request raises its key's token: PUT <url path>k<i>, cycling over KEYS
-- keys, with X-Fencing-Token = BASE + the number of requests sent so far for that
-- key (a per-key counter). With the file store every request needs a commit.
--
--   wrk ... -s raise.lua http://127.0.0.1:PORT/objects/raise/ -- KEYS BASE
--
-- BASE must be above every token an earlier run sent to the same keys (each wrk
-- run starts a fresh Lua state); run.sh passes 1e9 x (number of the run).
-- Use with -t1: one Lua state, so one counter per key.

dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local keys = 10000
local counters = {}
local paths = {}
local n = 0
local headers = { ["Content-Type"] = "application/octet-stream" }

function init(args)
   keys = tonumber(args[1]) or 10000
   local base = tonumber(args[2]) or 1000000000
   for i = 0, keys - 1 do
      counters[i] = base
      paths[i] = wrk.path .. "k" .. i
   end
end

function request()
   local i = n
   n = n + 1
   if n == keys then
      n = 0
   end
   local token = counters[i] + 1
   counters[i] = token
   -- Tokens stay far below 2^53, so the double prints exactly.
   headers["X-Fencing-Token"] = string.format("%.0f", token)
   return wrk.format("PUT", paths[i], headers, BODY)
end
