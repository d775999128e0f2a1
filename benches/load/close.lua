-- Every request is the same fenced write on a connection of its own: PUT <url
-- path> with a 16-byte body, X-Fencing-Token: 7 and Connection: close, so the
-- proxy accepts (and the client opens) a new connection for every request.
--
--   wrk ... -s close.lua http://127.0.0.1:PORT/objects/churn/k0
--
-- No request() function, so wrk builds the request once (a static request).

dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

wrk.method = "PUT"
wrk.body = BODY
wrk.headers["X-Fencing-Token"] = "7"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Connection"] = "close"
