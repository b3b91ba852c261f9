"""Lua scripts that make each state change of a job atomic in Redis.

Submit, cancel and a worker's claim race each other (many producers, many workers); each script
reads the status hash and acts in one step, so a job is enqueued once, cancelled before start
or started, never both. Times come from Redis ``TIME`` so all timings share one clock.
"""

from __future__ import annotations

# Seconds as "sec.micro" from Redis' clock; shared preamble of every script.
_NOW = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
"""

# Admission and enqueue in one step, so concurrent producers can never overshoot a limit.
# KEYS: status hash, the job's band stream (`Keys.band`), band load hash (`Keys.band_load`),
#   tenant load hash (`Keys.tenant_load`), limits hash (`Keys.limits`), recent list
#   (`Keys.recent`).
# ARGV: job id, payload JSON, priority, tenant, band, cost in tokens (`admission.estimate_cost_
#   tokens`).
# Limits are fields `<scope>:<kind>` of the limits hash (scope `band:<band>`, `tenant:<name>`,
# or `tenant:*` for tenants without their own; kind `jobs` or `tokens`); a missing field is no
# limit. A job is refused when it would take its scope past a limit; a tokens limit is not
# applied to a scope with nothing queued, or a job costing more than the limit would be refused
# forever (so a scope holds at most max(limit, one job's cost) tokens). Jobs limit 0 closes it.
# Returns {1, stream id} when enqueued, {0, stream id of the existing job} when the id exists
# (nothing counted again), {-1, scope, kind, current, limit} when refused (nothing written).
SUBMIT = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], 'stream_id') or ''}
end
local cost = tonumber(ARGV[6])
local function limit_of(scope, fallback, kind)
  local limit = redis.call('HGET', KEYS[5], scope .. ':' .. kind)
  if not limit and fallback then limit = redis.call('HGET', KEYS[5], fallback .. ':' .. kind) end
  return tonumber(limit)
end
local function over(load_key, scope, fallback)
  local jobs = tonumber(redis.call('HGET', load_key, 'jobs') or '0')
  local tokens = tonumber(redis.call('HGET', load_key, 'tokens') or '0')
  local limit = limit_of(scope, fallback, 'jobs')
  if limit and jobs + 1 > limit then return {-1, scope, 'jobs', jobs, limit} end
  limit = limit_of(scope, fallback, 'tokens')
  if limit and jobs > 0 and tokens + cost > limit then
    return {-1, scope, 'tokens', tokens, limit}
  end
  return nil
end
local band_scope = 'band:' .. ARGV[5]
local tenant_scope = 'tenant:' .. ARGV[4]
local refused = over(KEYS[3], band_scope, nil) or over(KEYS[4], tenant_scope, 'tenant:*')
if refused then return refused end
local sid = redis.call('XADD', KEYS[2], '*', 'id', ARGV[1], 'payload', ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'queued', 'submitted_at', now, 'priority', ARGV[3],
           'tenant', ARGV[4], 'stream_id', sid, 'band', ARGV[5], 'cost_tokens', ARGV[6])
for _, key in ipairs({KEYS[3], KEYS[4]}) do
  redis.call('HINCRBY', key, 'jobs', 1)
  redis.call('HINCRBY', key, 'tokens', cost)
end
redis.call('LPUSH', KEYS[6], ARGV[1])
redis.call('LTRIM', KEYS[6], 0, 99)
return {1, sid}
"""
)

# Shared by CANCEL and CLAIM: a job leaving "queued" gives back what SUBMIT counted, once (the
# callers check the state first, and only SUBMIT sets `band`, so a job enqueued with a bare XADD
# or by hand never counted and gives back nothing). The load keys are derived from the key
# prefix (ARGV) and the hash's `band` and `tenant`, as `Keys.band_load` / `Keys.tenant_load`
# spell them: keys not passed in KEYS are not cluster-safe, which holds for the whole protocol
# (one single-node Redis).
_UNLOAD = """
local function unload(prefix)
  local f = redis.call('HMGET', KEYS[1], 'band', 'tenant', 'cost_tokens')
  if not prefix or prefix == '' or not f[1] then return end
  local cost = tonumber(f[3] or '0')
  for _, key in ipairs({prefix .. ':load:band:' .. f[1], prefix .. ':load:tenant:' .. f[2]}) do
    redis.call('HINCRBY', key, 'jobs', -1)
    redis.call('HINCRBY', key, 'tokens', -cost)
  end
end
"""

# KEYS: status hash, events stream, cancels stream. ARGV: job id, ttl_s, cancelled event JSON,
#   key prefix (for the load keys, see _UNLOAD).
# A queued job ends here and now; a running one is flagged and its worker told via the cancels
# stream. Returns "cancelled", "cancelling", "missing" or the terminal state it already had.
CANCEL = (
    _NOW
    + _UNLOAD
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state == 'queued' then
  unload(ARGV[4])
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished_at', now)
  redis.call('XADD', KEYS[2], '*', 'type', 'cancelled', 'data', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  return 'cancelled'
end
if state == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '10000', '*', 'id', ARGV[1])
  return 'cancelling'
end
return state
"""
)

# A worker takes a job it read from a jobs stream.
# KEYS: status hash, events stream, the jobs stream the entry was read from (its band's).
# ARGV: action ("start" | "reject"), worker name, deadline ("" or unix seconds), ttl_s, error
#   event JSON (for "reject"), expired event JSON, consumer group, the job's entry id in the
#   jobs stream, key prefix (`Keys.prefix`, for the load keys, see _UNLOAD).
# A queued job that leaves "queued" here (started, rejected, expired) gives back its load. A
# worker that omits the prefix (written before admission limits) leaves the load counted.
# Only a job that is queued (or has no status hash: enqueued by hand with XADD) can be taken;
# anything else (cancelled while queued, a duplicate entry) returns its state and is skipped.
# A claim retried by the same worker for the same entry (its reply was lost to a connection
# error) answers "started" again with the original times, so the job is not stranded.
# Every outcome but "started" ends the job's delivery here: its entry is acknowledged after the
# terminal event is written, in the same atomic step, and deleted (the jobs stream holds only
# jobs not yet ended, so it needs no trimming that could drop a pending one).
# Returns {outcome, submitted_at, now} with outcome "started" | "rejected" | "expired" | state.
CLAIM = (
    _NOW
    + _UNLOAD
    + """
local state = redis.call('HGET', KEYS[1], 'state')
local mine = redis.call('HMGET', KEYS[1], 'worker', 'entry_id', 'submitted_at', 'started_at')
if state == 'running' and mine[1] == ARGV[2] and mine[2] == ARGV[8] then
  return {'started', mine[3], mine[4]}  -- this worker's claim again, its first reply lost
end
if state and state ~= 'queued' then
  redis.call('XACK', KEYS[3], ARGV[7], ARGV[8])
  redis.call('XDEL', KEYS[3], ARGV[8])
  return {state, '', now}
end
if state then unload(ARGV[9]) end
local submitted = redis.call('HGET', KEYS[1], 'submitted_at')
if not submitted then
  submitted = now
  redis.call('HSET', KEYS[1], 'submitted_at', now)
end
local function finish(final, event_type, data)
  redis.call('HSET', KEYS[1], 'state', final, 'finished_at', now, 'worker', ARGV[2])
  redis.call('XADD', KEYS[2], '*', 'type', event_type, 'data', data)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
  redis.call('XACK', KEYS[3], ARGV[7], ARGV[8])
  redis.call('XDEL', KEYS[3], ARGV[8])
end
if ARGV[1] == 'reject' then
  local err = cjson.decode(ARGV[5])
  redis.call('HSET', KEYS[1], 'error_code', err['code'], 'error_message', err['message'])
  finish('error', 'error', ARGV[5])
  return {'rejected', submitted, now}
end
if ARGV[3] ~= '' and tonumber(now) > tonumber(ARGV[3]) then
  finish('expired', 'expired', ARGV[6])
  return {'expired', submitted, now}
end
local queued = string.format('%.6f', tonumber(now) - tonumber(submitted))
redis.call('HSET', KEYS[1], 'state', 'running', 'started_at', now, 'worker', ARGV[2],
           'deliveries', 1, 'entry_id', ARGV[8])
redis.call('XADD', KEYS[2], '*', 'type', 'started',
           'data', cjson.encode({type = 'started', worker = ARGV[2], queued_s = tonumber(queued)}))
return {'started', submitted, now}
"""
)

# A worker takes over a running job whose worker stopped renewing its lease (it died, or was
# stopped and handed the job back), after XCLAIMing its jobs-stream entry.
# KEYS: status hash, events stream, the entry's jobs stream, dead-letter stream.
# ARGV: this worker, the old worker (the entry's consumer), max deliveries, ttl_s, error event
#   JSON (dead letter; `{deliveries}` in its message becomes the count), consumer group, entry
#   id, job id, the entry's payload.
# A job handed back by a graceful stop (``handoff``) is not counted as a failed delivery; any
# other takeover is, and past max deliveries the job ends with the error event and goes to the
# dead-letter stream: a job that kills every worker running it stops there.
# Returns {outcome, deliveries}: "resumed" (continue it from its events), "queued" (never
# started: take it as a new job), "dead_letter", "owned" (another worker runs it now), or the
# terminal state it already reached (the old worker died after the end, before the ack).
RECLAIM = (
    _NOW
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'queued' then return {'queued', 0} end
if state ~= 'running' then
  redis.call('XACK', KEYS[3], ARGV[6], ARGV[7])
  redis.call('XDEL', KEYS[3], ARGV[7])
  return {state, 0}
end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2] then return {'owned', 0} end
local n = tonumber(redis.call('HGET', KEYS[1], 'deliveries') or '1')
if redis.call('HGET', KEYS[1], 'handoff') == '1' then
  redis.call('HDEL', KEYS[1], 'handoff')
else
  n = redis.call('HINCRBY', KEYS[1], 'deliveries', 1)
end
if n > tonumber(ARGV[3]) then
  -- The message counts the deliveries that happened (n - 1 workers ran it), not the setting.
  local err = cjson.decode(ARGV[5])
  err['message'] = (string.gsub(err['message'], '{deliveries}', tostring(n - 1)))
  redis.call('HSET', KEYS[1], 'state', 'error', 'finished_at', now, 'worker', ARGV[1],
             'error_code', err['code'], 'error_message', err['message'])
  redis.call('XADD', KEYS[2], '*', 'type', 'error', 'data', cjson.encode(err))
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10000', '*', 'id', ARGV[8], 'entry_id', ARGV[7],
             'payload', ARGV[9], 'deliveries', n, 'worker', ARGV[2])
  redis.call('XACK', KEYS[3], ARGV[6], ARGV[7])
  redis.call('XDEL', KEYS[3], ARGV[7])
  return {'dead_letter', n}
end
redis.call('HSET', KEYS[1], 'worker', ARGV[1], 'resumed_at', now)
return {'resumed', n}
"""
)
