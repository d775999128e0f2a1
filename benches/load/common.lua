-- Shared by the fencegate load scripts (loaded with dofile from each of them).
--
-- done() prints one machine-readable line that run.sh parses. Latencies are in
-- microseconds. `status` counts responses with a status above 399 (wrk's own
-- definition), the socket error counters are wrk's.

BODY = string.rep("x", 16) -- the request body of every write: 16 bytes, sent with Content-Length

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "WRK_RESULT requests=%d duration_us=%d p50_us=%.0f p99_us=%.0f mean_us=%.1f" ..
      " connect=%d read=%d write=%d status=%d timeout=%d\n",
      summary.requests, summary.duration,
      latency:percentile(50), latency:percentile(99), latency.mean,
      e.connect, e.read, e.write, e.status, e.timeout))
end
