"""Lua scripts of ``RedisCluster`` (each one atomic in Redis). Layout of the keys:

| key | type | holds |
|---|---|---|
| ``<p>cl:res:<replica>`` | hash lora_name → JSON ``{state, pid, ts, …}`` | residency records |
| ``<p>cl:mark:<replica>`` | hash ``<lora_name>|<pid>`` → token | in-flight marks per process |
| ``<p>cl:procs`` | sorted set pid → lease expiry (ms, Redis time) | live gateway processes |
| ``<p>cl:lead:<chore>`` | string pid, PX lease | the process running a cluster-wide chore |
| ``<p>cl:loads:<pool>`` | sorted set ``<replica>|<lora_name>`` → expiry (ms) | loads in flight in a pool |
| ``<p>cl:gone:<replica>`` | hash lora_name → wall time (s), expires | recent unloads (tombstones) |
| ``<p>cl:turn:<replica>`` | hash pid → expiry (ms); ``~last`` → pid | waiting for a load slot; last claimer |

A ``loading`` record with ``settling: true`` (its load call went unanswered; the replica may
still finish it) counts toward ``max_adapters`` but not toward the loads in flight. A record in
``staging`` or ``unloading`` written by a process whose lease expired is
abandoned: ``staging`` never reached the engine (dropped); ``loading`` and ``unloading`` may
have, so they count as ``resident`` again until the next ``/v1/models`` poll says otherwise.
"""

from __future__ import annotations

PRELUDE = """
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function alive(procs, pid)
  local s = redis.call('ZSCORE', procs, pid)
  return s ~= false and s ~= nil and tonumber(s) >= nowms
end
local function live_marks(marks, procs, lora)
  local n = 0
  local prefix = lora .. '|'
  local all = redis.call('HGETALL', marks)
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, #prefix) == prefix then
      if alive(procs, string.sub(f, #prefix + 1)) then n = n + 1 else redis.call('HDEL', marks, f) end
    end
  end
  return n
end
local function rec(state, pid, ts)
  return cjson.encode({state = state, pid = pid, ts = ts})
end
-- Decode every record of a replica, settling those abandoned by dead processes.
local function records(res, procs, nowts)
  local out = {}
  local raw = redis.call('HGETALL', res)
  for i = 1, #raw, 2 do
    local name = raw[i]
    local ok, r = pcall(cjson.decode, raw[i + 1])
    if not ok or type(r) ~= 'table' or type(r.state) ~= 'string' then
      redis.call('HDEL', res, name)
    elseif (r.state == 'staging' or r.state == 'loading' or r.state == 'unloading')
        and not alive(procs, tostring(r.pid)) then
      if r.state == 'staging' then
        redis.call('HDEL', res, name)
      else
        local v = rec('resident', tostring(r.pid), nowts)
        redis.call('HSET', res, name, v)
        out[name] = {state = 'resident', raw = v}
      end
    else
      out[name] = {state = r.state, ts = tonumber(r.ts) or 0, raw = raw[i + 1], settling = r.settling == true}
    end
  end
  return out
end
"""

# KEYS: res, marks, procs   ARGV: lora_name, pid, token
MARK = (
    PRELUDE
    + """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  local ok, r = pcall(cjson.decode, raw)
  if ok and type(r) == 'table' and r.state == 'unloading' and alive(KEYS[3], tostring(r.pid)) then
    return 0
  end
end
redis.call('HSET', KEYS[2], ARGV[1] .. '|' .. ARGV[2], ARGV[3])
return 1
"""
)

# KEYS: marks   ARGV: field1, token1, field2, token2, …  (delete each field still holding its token)
UNMARK = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i]); n = n + 1
  end
end
return n
"""

# KEYS: res, marks, procs, pool_loads, turns   ARGV: lora_name, max_adapters, pid, now (wall s),
# since, max_loads (replica, 0 = no cap), max_pool_loads (0 = no cap), pool entry ttl (ms), pool
# member, turn ttl (ms, 0 = no turns), background ('1': yields to any waiting process, never
# registers), ncand, cand…   → {'present', raw} | {'failed', raw} | {'full'}
# | {'busy', 'replica' | 'pool' | 'turn'} | {'reserved', victim…}
# Turns: at a replica's cap a process registers as waiting there (pid → expiry); when a slot is
# free, the process that claimed the last one yields it while another process waits.
CLAIM = (
    PRELUDE
    + """
local recs = records(KEYS[1], KEYS[3], tonumber(ARGV[4]))
local count = 0
local loading = 0
for _, r in pairs(recs) do
  if r.state ~= 'failed' then count = count + 1 end
  if (r.state == 'staging' or r.state == 'loading') and not r.settling then loading = loading + 1 end
end
local mine = recs[ARGV[1]]
if mine then
  if mine.state ~= 'failed' then return {'present', mine.raw} end
  if (mine.ts or 0) >= tonumber(ARGV[5]) then return {'failed', mine.raw} end
end
local max_loads = tonumber(ARGV[6])
local turn_ttl = tonumber(ARGV[10])
local turns = max_loads > 0 and turn_ttl > 0
if turns then
  local others, last = false, false
  local all = redis.call('HGETALL', KEYS[5])
  for i = 1, #all, 2 do
    local f = all[i]
    if f == '~last' then
      last = all[i + 1] == ARGV[3]
    elseif f ~= ARGV[3] then
      if tonumber(all[i + 1]) >= nowms then others = true else redis.call('HDEL', KEYS[5], f) end
    end
  end
  local background = ARGV[11] == '1'
  local why = false
  if loading >= max_loads then
    why = 'replica'
  elseif others and (last or background) then
    why = 'turn'
  end
  if why then
    if not background then
      redis.call('HSET', KEYS[5], ARGV[3], nowms + turn_ttl)
      redis.call('PEXPIRE', KEYS[5], 600000)
    end
    return {'busy', why}
  end
elseif max_loads > 0 and loading >= max_loads then
  return {'busy', 'replica'}
end
local max_pool = tonumber(ARGV[7])
if max_pool > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', nowms)
  if redis.call('ZCARD', KEYS[4]) >= max_pool then return {'busy', 'pool'} end
end
local max = tonumber(ARGV[2])
local chosen = {}
if count >= max then
  local need = count - max + 1
  for i = 1, tonumber(ARGV[12]) do
    if #chosen >= need then break end
    local v = ARGV[12 + i]
    local e = recs[v]
    if e and e.state == 'resident' and live_marks(KEYS[2], KEYS[3], v) == 0 then
      table.insert(chosen, v)
      recs[v] = nil
    end
  end
  if #chosen < need then return {'full'} end
  for _, v in ipairs(chosen) do
    redis.call('HSET', KEYS[1], v, rec('unloading', ARGV[3], tonumber(ARGV[4])))
  end
end
redis.call('HSET', KEYS[1], ARGV[1], rec('staging', ARGV[3], tonumber(ARGV[4])))
if max_pool > 0 then redis.call('ZADD', KEYS[4], nowms + tonumber(ARGV[8]), ARGV[9]) end
if turns and ARGV[11] ~= '1' then
  redis.call('HDEL', KEYS[5], ARGV[3])
  redis.call('HSET', KEYS[5], '~last', ARGV[3])
  redis.call('PEXPIRE', KEYS[5], 600000)
end
local out = {'reserved'}
for _, v in ipairs(chosen) do table.insert(out, v) end
return out
"""
)

# KEYS: res, marks, procs   ARGV: lora_name, pid, now (wall s)
BEGIN_UNLOAD = (
    PRELUDE
    + """
local recs = records(KEYS[1], KEYS[3], tonumber(ARGV[3]))
local r = recs[ARGV[1]]
if r and r.state ~= 'resident' then return 0 end
if live_marks(KEYS[2], KEYS[3], ARGV[1]) > 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], rec('unloading', ARGV[2], tonumber(ARGV[3])))
return 1
"""
)

# KEYS: res, procs, gone   ARGV: pid, now (wall s), asked_at (wall s), n, listed…
# ``gone`` (name → wall time of its unload) keeps an answer asked before an unload from bringing
# the record back.
SYNC = (
    PRELUDE
    + """
local listed = {}
for i = 1, tonumber(ARGV[4]) do listed[ARGV[4 + i]] = true end
local now = tonumber(ARGV[2])
local recs = records(KEYS[1], KEYS[2], now)
for name, r in pairs(recs) do
  if r.state == 'resident' and not listed[name] and (r.ts or 0) < tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], name); recs[name] = nil
  elseif r.state == 'failed' and now - (r.ts or 0) > 30 then
    redis.call('HDEL', KEYS[1], name); recs[name] = nil
  end
end
for name, _ in pairs(listed) do
  local r = recs[name]
  local gone = redis.call('HGET', KEYS[3], name)
  if r == nil and gone and tonumber(gone) >= tonumber(ARGV[3]) then
    r = false  -- unloaded after the question was asked: a stale answer
  end
  if r == nil or (r and r.state == 'failed') then
    redis.call('HSET', KEYS[1], name, rec('resident', ARGV[1], now))
  end
end
return 1
"""
)

# KEYS: procs   ARGV: pid, lease_ms
HEARTBEAT = """
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], nowms + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowms - 3600000)
return nowms
"""

# KEYS: lead   ARGV: pid, lease_ms
LEAD = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]); return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]); return 1 end
return 0
"""

# KEYS: lead   ARGV: pid
RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
