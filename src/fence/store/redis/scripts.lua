-- (Not loaded as one file: scripts.rs cuts it at the "-- script:" lines and
-- prefixes each script with the shared part above the first of them.)
--
-- Tokens travel as canonical base-10 strings (no sign, no leading zero):
-- Lua's numbers are doubles, exact only below 2^53, and a token is a u64.
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- The store's identity (KEYS[id]) must be the one this replica knows
-- (ARGV[1]); when it is not, nothing is read or written and the caller is
-- told what is there now. The deletions counter comes back with every
-- answer, so a replica forgets the marks it remembers when an operator
-- deleted some through any replica.
local function identity(key, expected)
  local found = redis.call('HMGET', key, 'id', 'previous', 'deletions')
  if found[1] ~= expected then
    return {'identity', found[1] or '', found[2] or '', found[3] or '0'}
  end
  return nil, found[3] or '0'
end

-- The Redis server's time in milliseconds: every lease and hold is on its clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Milliseconds as a base-10 integer string (tostring would write 1.7e+12).
local function ms(n)
  return string.format('%.0f', n)
end

-- script: enter
-- One fenced write's turn of a key, across replicas: the compare-and-raise
-- and the record of the write in flight, in one step.
-- KEYS: mark, flight, wait, index, identity, shared
-- ARGV: identity, token, member, lease ms, alone ('1'/'0'), wait ms, key
local refused, deletions = identity(KEYS[5], ARGV[1])
if refused then return refused end
local token = ARGV[2]
local mark = redis.call('GET', KEYS[1])
if mark and below(token, mark) then return {'stale', deletions, mark} end
local now = now_ms()
-- After an operator confirmed a store that lost its data, writes admitted
-- before the loss may still be in flight with no record left: every fenced
-- write is held until the longest of their leases has run out.
local held = redis.call('HGET', KEYS[5], 'held')
if held and now < tonumber(held) then return {'held', deletions, ms(tonumber(held) - now)} end
local waiting = redis.call('GET', KEYS[3])
if waiting and below(token, waiting) then return {'superseded', deletions, waiting} end
local lease = tonumber(ARGV[4])
-- The writes in flight: those whose replica has not ended them and whose
-- lease has not run out (a replica that died mid-write). Records whose
-- lease ran out stay until the set expires with its last lease.
local in_flight = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local function record()
  redis.call('ZADD', KEYS[2], now + lease, ARGV[3])
  -- The set lives as long as its longest lease: with writes in flight it
  -- has a TTL already, and only a longer one replaces it.
  if in_flight == 0 then
    redis.call('PEXPIRE', KEYS[2], lease)
  else
    redis.call('PEXPIRE', KEYS[2], lease, 'GT')
  end
  -- The token the writes in flight carry; none for a write that holds the
  -- key alone, which nothing joins.
  if ARGV[5] == '1' then
    redis.call('DEL', KEYS[6])
  else
    redis.call('SET', KEYS[6], token, 'PX', lease)
  end
end
-- The holder's own writes share the key, on every replica: a write that
-- carries the mark joins the writes in flight when they carry it too. (The
-- fence API may have raised the mark to this token while older writes are
-- still in flight: then it waits for them, as a raise does.)
if ARGV[5] == '0' and mark == token and (in_flight == 0 or redis.call('GET', KEYS[6]) == token) then
  record()
  return {'ok', deletions, mark}
end
-- A raise (and a write that holds its key alone) waits until no write of
-- the key is in flight anywhere; meanwhile its token is the one waiting,
-- and older tokens that arrive are refused.
if in_flight > 0 then
  if not waiting or not below(token, waiting) then
    redis.call('SET', KEYS[3], token, 'PX', ARGV[6])
  end
  return {'busy', deletions}
end
if waiting == token then redis.call('DEL', KEYS[3]) end
if not mark or below(mark, token) then
  redis.call('SET', KEYS[1], token)
  if not mark then redis.call('ZADD', KEYS[4], 0, ARGV[7]) end
end
record()
return {'ok', deletions, mark or ''}

-- script: raise
-- The fence API's raise, and a restore: compare-and-raise, no turn. A
-- restore (identity '*') raises whatever the store's identity says: an
-- operator asked for it.
-- KEYS: mark, index, identity
-- ARGV: identity, token, key
local refused, deletions = nil, '0'
if ARGV[1] ~= '*' then refused, deletions = identity(KEYS[3], ARGV[1]) end
if refused then return refused end
local mark = redis.call('GET', KEYS[1])
if mark and below(ARGV[2], mark) then return {'stale', deletions, mark} end
if not mark or below(mark, ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[2])
  if not mark then redis.call('ZADD', KEYS[2], 0, ARGV[3]) end
end
return {'ok', deletions, mark or ''}

-- script: get
-- KEYS: mark, identity
-- ARGV: identity
local refused, deletions = identity(KEYS[2], ARGV[1])
if refused then return refused end
return {'ok', deletions, redis.call('GET', KEYS[1]) or ''}

-- script: list
-- Up to ARGV[4] keys from ARGV[2] (exclusive when ARGV[3] is '1') to the
-- end of prefix range ARGV[5], with their marks.
-- KEYS: index, identity
-- ARGV: identity, from, exclusive, limit, to, mark key prefix
local refused, deletions = identity(KEYS[2], ARGV[1])
if refused then return refused end
local from = (ARGV[3] == '1' and '(' or '[') .. ARGV[2]
local keys = redis.call('ZRANGEBYLEX', KEYS[1], from, ARGV[5], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {'ok', deletions}
for _, k in ipairs(keys) do
  local mark = redis.call('GET', ARGV[6] .. k)
  if mark then
    out[#out + 1] = k
    out[#out + 1] = mark
  end
end
return out

-- script: delete
-- Drops up to ARGV[4] marks from ARGV[2] to ARGV[3] (a range of the index,
-- as in list), and counts a deletion in the identity so every replica
-- forgets the marks it remembers.
-- KEYS: index, identity
-- ARGV: identity, from, to, limit, mark key prefix
local refused, deletions = identity(KEYS[2], ARGV[1])
if refused then return refused end
local keys = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
local single = ''
for _, k in ipairs(keys) do
  if #keys == 1 then single = redis.call('GET', ARGV[5] .. k) or '' end
  redis.call('DEL', ARGV[5] .. k)
  redis.call('ZREM', KEYS[1], k)
end
if #keys > 0 then
  deletions = tostring(redis.call('HINCRBY', KEYS[2], 'deletions', 1))
end
return {'ok', deletions, tostring(#keys), single}

-- script: confirm
-- An operator's confirmation: the store's new identity, naming the one it
-- replaces, and the hold of fenced writes from now (the Redis server's
-- time) for ARGV[3] ms. Runs whatever the identity says.
-- KEYS: identity
-- ARGV: new identity, previous identity, hold ms
local now = now_ms()
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'previous', ARGV[2], 'confirmed', ms(now),
  'held', ms(now + tonumber(ARGV[3])))
return {'ok', redis.call('HGET', KEYS[1], 'deletions') or '0', ARGV[3]}

-- script: hold
-- A replica taking a confirmed identity: the hold lasts at least ARGV[2] ms
-- from the confirmation (this replica's longest write lease). Answers the
-- hold left, in ms.
-- KEYS: identity
-- ARGV: identity, lease ms
local refused, deletions = identity(KEYS[1], ARGV[1])
if refused then return refused end
local now = now_ms()
local confirmed = redis.call('HGET', KEYS[1], 'confirmed')
local held = tonumber(redis.call('HGET', KEYS[1], 'held') or '0')
if confirmed then
  local until_ms = tonumber(confirmed) + tonumber(ARGV[2])
  if until_ms > held then
    held = until_ms
    redis.call('HSET', KEYS[1], 'held', ms(held))
  end
end
return {'ok', deletions, ms(math.max(held - now, 0))}

-- script: held
-- The hold left, in ms (0: none), whatever the identity says.
-- KEYS: identity
-- ARGV: (none used)
local held = tonumber(redis.call('HGET', KEYS[1], 'held') or '0')
return {'ok', redis.call('HGET', KEYS[1], 'deletions') or '0', ms(math.max(held - now_ms(), 0))}

-- script: lease
-- A key's lease record (JSON, '' for none).
-- KEYS: lease, identity
-- ARGV: identity
local refused, deletions = identity(KEYS[2], ARGV[1])
if refused then return refused end
return {'ok', deletions, redis.call('GET', KEYS[1]) or ''}

-- script: swap_lease
-- Puts a new lease record in place of the one expected (compared whole, ''
-- for none), or removes it ('' new); 'busy' when another is there. The
-- record lives ARGV[4] ms, past its lease's end: long enough for a late
-- holder to be told it ran out.
-- KEYS: lease, identity
-- ARGV: identity, expected, new, keep ms
local refused, deletions = identity(KEYS[2], ARGV[1])
if refused then return refused end
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[2] then return {'busy', deletions} end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
end
return {'ok', deletions}
