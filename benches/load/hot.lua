-- Every request is the same fenced write: PUT <url path> with a 16-byte body and
-- X-Fencing-Token: 7 (constant, equal to the key's mark after the first one).
--
--   wrk ... -s hot.lua http://127.0.0.1:PORT/objects/hot/k0
--
-- No request() function, so wrk builds the request once (a static request).

dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

wrk.method = "PUT"
wrk.body = BODY
wrk.headers["X-Fencing-Token"] = "7"
wrk.headers["Content-Type"] = "application/octet-stream"
