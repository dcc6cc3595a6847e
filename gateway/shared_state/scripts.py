"""The Lua scripts and key names of the shared state: each script one atomic step in Redis.

Versions are the writers' wall-clock microseconds, passed as strings: Lua numbers print with
14 digits, which would round them. Liveness (leases, quota slots) uses Redis's own TIME, so
the hosts' clocks only order routing outcomes, never expire anything.
Keys outside KEYS are built in four scripts: a single Redis (or a replicated pair), no Cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    """Every key and the channel under one prefix."""

    prefix: str

    @property
    def channel(self) -> str:
        return f"{self.prefix}:events"

    def tier(self, name: str) -> tuple[str, str]:
        """(replica by entry, version by entry) of a tier-1 map: "prompts" or "sessions"."""
        return f"{self.prefix}:{name}", f"{self.prefix}:{name}:v"

    def prefixes(self, replica: str) -> str:
        return f"{self.prefix}:x:{replica}"

    @property
    def procs(self) -> str:
        return f"{self.prefix}:procs"

    @property
    def inflight_base(self) -> str:
        return f"{self.prefix}:inflight:"

    def inflight(self, process_id: str) -> str:
        return self.inflight_base + process_id

    @property
    def scrape_base(self) -> str:
        """Prefix of each replica's scrape lease (its value: the owning process id)."""
        return f"{self.prefix}:scrape:"

    @property
    def scrapers(self) -> str:
        """The processes taking scrape leases, scored by when their last claim lapses (ms)."""
        return f"{self.prefix}:scrapers"

    def quota(self, tenant: str) -> tuple[str, str]:
        """(token buckets, concurrency slots by process) of a tenant."""
        return f"{self.prefix}:q:{tenant}", f"{self.prefix}:qc:{tenant}"


_HDEL_ALL = """
local function hdel_all(key, fields, step)
  for i = 1, #fields, 1000 * step do
    local chunk = {}
    for j = i, math.min(#fields, i + 1000 * step - 1), step do chunk[#chunk + 1] = fields[j] end
    if #chunk > 0 then redis.call('HDEL', key, unpack(chunk)) end
  end
end
"""

# KEYS: replica-by-entry hash, version zset. ARGV: oldest version kept, max entries, key TTL ms,
# then (entry, version, replica) triples. A triple older than (or as old as) what the map holds
# is rejected: a stale writer cannot overwrite newer state. Returns {applied, rejected}.
MERGE = (
    _HDEL_ALL
    + """
local applied, rejected = 0, 0
for i = 4, #ARGV, 3 do
  local cur = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if cur and tonumber(cur) >= tonumber(ARGV[i + 1]) then
    rejected = rejected + 1
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i])
    applied = applied + 1
  end
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1])
if #expired > 0 then
  hdel_all(KEYS[1], expired, 1)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1])
end
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[2])
if over > 0 then hdel_all(KEYS[1], redis.call('ZPOPMIN', KEYS[2], over), 2) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {applied, rejected}
"""
)

# KEYS: a replica's prefix placements zset. ARGV: max members, key TTL ms, then (version,
# block hashes joined by spaces) pairs, oldest first (a block in two: the later one wins).
# Keeps the newest max members; hashes stay strings (Lua numbers would round them).
PLACE = """
local args = {}
for i = 3, #ARGV, 2 do
  for h in string.gmatch(ARGV[i + 1], '%S+') do
    args[#args + 1] = ARGV[i]
    args[#args + 1] = h
    if #args >= 2000 then redis.call('ZADD', KEYS[1], unpack(args)); args = {} end
  end
end
if #args > 0 then redis.call('ZADD', KEYS[1], unpack(args)) end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[1]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_NOW_MS = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: procs zset, own in-flight hash, then each tenant's concurrency hash. ARGV: process id,
# lease ms, in-flight key base, n, n (field, value) pairs (the version under "", then replica
# and count), then one slot count per tenant key. Rewrites the process's lease whole (a lost
# settle or a cancelled reserve heals at the next beat), then returns the other live
# processes' leases: {peers, process id, {field, value, ...}, ...} (shared_state/counts.py).
# One script, one round trip: the counts themselves are pushed with the flush.
BEAT = (
    _NOW_MS
    + """
local pid, lease = ARGV[1], tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%.0f', now_ms), pid)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%.0f', now_ms - lease))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2])
local n = tonumber(ARGV[4])
redis.call('HSET', KEYS[2], unpack(ARGV, 5, 4 + 2 * n))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
for k = 3, #KEYS do
  local held = ARGV[4 + 2 * n + k - 2]
  if held == '0' then redis.call('HDEL', KEYS[k], pid)
  else redis.call('HSET', KEYS[k], pid, held) end
  redis.call('PEXPIRE', KEYS[k], ARGV[2])
end
local pids = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.0f', now_ms - lease), '+inf')
local out = {0}
for _, other in ipairs(pids) do
  if other ~= pid then
    out[1] = out[1] + 1
    out[#out + 1] = other
    out[#out + 1] = redis.call('HGETALL', ARGV[3] .. other)
  end
end
return out
"""
)

_BUCKET = (
    _NOW_MS
    + """
local now = now_ms / 1000
local function level(cap, lf, af)
  local v = redis.call('HMGET', KEYS[1], lf, af)
  local l, at = tonumber(v[1]), tonumber(v[2])
  if l == nil or at == nil then return cap end
  if now > at then l = math.min(cap, l + (now - at) * cap / 60) end
  return l
end
"""
)

# KEYS: tenant buckets, tenant slots, procs. ARGV: process id, max_concurrent, rpm, tpm,
# tokens, lease ms. Refuses ({limit, retry seconds}) or takes all at once (nil). A slot held
# by a process whose lease ran out is freed here: a dead gateway leaks none.
RESERVE = (
    _BUCKET
    + """
local pid, maxc, rpm, tpm = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if maxc > 0 then
  local held, total = redis.call('HGETALL', KEYS[2]), 0
  local alive = now_ms - tonumber(ARGV[6])
  for i = 1, #held, 2 do
    local seen = redis.call('ZSCORE', KEYS[3], held[i])
    if held[i] == pid or (seen and tonumber(seen) >= alive) then
      total = total + tonumber(held[i + 1])
    else
      redis.call('HDEL', KEYS[2], held[i])
    end
  end
  if total >= maxc then return {'max_concurrent', '1'} end
end
local rl, tl
if rpm > 0 then
  rl = level(rpm, 'rl', 'ra')
  if rl < 1 then return {'requests_per_minute', tostring((1 - rl) * 60 / rpm)} end
end
local cost = math.min(tonumber(ARGV[5]), tpm)
if tpm > 0 then
  tl = level(tpm, 'tl', 'ta')
  if tl < cost then return {'tokens_per_minute', tostring((cost - tl) * 60 / tpm)} end
end
if maxc > 0 then
  redis.call('HINCRBY', KEYS[2], pid, 1)
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
if rpm > 0 then redis.call('HSET', KEYS[1], 'rl', tostring(rl - 1), 'ra', tostring(now)) end
if tpm > 0 then redis.call('HSET', KEYS[1], 'tl', tostring(tl - cost), 'ta', tostring(now)) end
-- A bucket left alone for a minute is full again: an expired key reads as full.
redis.call('PEXPIRE', KEYS[1], 120000)
return false
"""
)

# KEYS: tenant buckets, tenant slots. ARGV: process id, tpm, reserved, used ('' = unknown).
SETTLE = (
    _BUCKET
    + """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  if redis.call('HINCRBY', KEYS[2], ARGV[1], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[1]) end
end
local tpm = tonumber(ARGV[2])
if tpm > 0 and ARGV[4] ~= '' then
  local l = level(tpm, 'tl', 'ta')
  l = math.min(tpm, l + math.min(tonumber(ARGV[3]), tpm) - tonumber(ARGV[4]))
  redis.call('HSET', KEYS[1], 'tl', tostring(l), 'ta', tostring(now))
  redis.call('PEXPIRE', KEYS[1], 120000)
end
return 1
"""
)

# KEYS: scrapers zset. ARGV: process id, lease ms, scrape lease key base, then the replicas in
# this process's order of preference. Registers the process as a scraper, gives up the leases
# it holds beyond its fair share (ceil(replicas / live scrapers): the others take them at their
# next claim), takes free ones up to it, renews what it keeps. Returns the replicas it holds.
CLAIM = (
    _NOW_MS
    + """
local pid, lease, base = ARGV[1], tonumber(ARGV[2]), ARGV[3]
redis.call('ZADD', KEYS[1], string.format('%.0f', now_ms + lease), pid)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%.0f', now_ms))
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local fair = math.ceil((#ARGV - 3) / math.max(1, redis.call('ZCARD', KEYS[1])))
local mine, free = {}, {}
for i = 4, #ARGV do
  local owner = redis.call('GET', base .. ARGV[i])
  if owner == pid then mine[#mine + 1] = ARGV[i]
  elseif not owner then free[#free + 1] = ARGV[i] end
end
while #mine > fair do redis.call('DEL', base .. table.remove(mine)) end
for _, name in ipairs(free) do
  if #mine >= fair then break end
  mine[#mine + 1] = name
end
for _, name in ipairs(mine) do redis.call('SET', base .. name, pid, 'PX', ARGV[2]) end
return mine
"""
)

# KEYS: scrapers zset. ARGV: process id, scrape lease key base, replicas. A stopping process
# gives its leases up: the others take them at their next claim, not a lease TTL later.
RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
for i = 3, #ARGV do
  if redis.call('GET', ARGV[2] .. ARGV[i]) == ARGV[1] then redis.call('DEL', ARGV[2] .. ARGV[i]) end
end
return 1
"""

ALL = {
    "merge": MERGE,
    "place": PLACE,
    "beat": BEAT,
    "claim": CLAIM,
    "release": RELEASE,
    "reserve": RESERVE,
    "settle": SETTLE,
}


def sha1(script: str) -> str:
    """The digest EVALSHA names a script by (what SCRIPT LOAD returns)."""
    return hashlib.sha1(script.encode()).hexdigest()


SHAS = {name: sha1(text) for name, text in ALL.items()}
