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

# KEYS: status hash, jobs stream. ARGV: job id, payload JSON, priority, tenant.
# Returns {1, stream id} when enqueued, {0, stream id of the existing job} when the id exists.
SUBMIT = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], 'stream_id') or ''}
end
local sid = redis.call('XADD', KEYS[2], '*', 'id', ARGV[1], 'payload', ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'queued', 'submitted_at', now, 'priority', ARGV[3],
           'tenant', ARGV[4], 'stream_id', sid)
return {1, sid}
"""
)

# KEYS: status hash, events stream, cancels stream. ARGV: job id, ttl_s, cancelled event JSON.
# A queued job ends here and now; a running one is flagged and its worker told via the cancels
# stream. Returns "cancelled", "cancelling", "missing" or the terminal state it already had.
CANCEL = (
    _NOW
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state == 'queued' then
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

# A worker takes a job it read from the jobs stream.
# KEYS: status hash, events stream, jobs stream. ARGV: action ("start" | "reject"), worker name,
#   deadline ("" or unix seconds), ttl_s, error event JSON (for "reject"), expired event JSON,
#   consumer group, the job's entry id in the jobs stream.
# Only a job that is queued (or has no status hash: enqueued by hand with XADD) can be taken;
# anything else (cancelled while queued, a duplicate entry) returns its state and is skipped.
# Every outcome but "started" ends the job's delivery here: its entry is acknowledged after the
# terminal event is written, in the same atomic step, and deleted (the jobs stream holds only
# jobs not yet ended, so it needs no trimming that could drop a pending one).
# Returns {outcome, submitted_at, now} with outcome "started" | "rejected" | "expired" | state.
CLAIM = (
    _NOW
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then
  redis.call('XACK', KEYS[3], ARGV[7], ARGV[8])
  redis.call('XDEL', KEYS[3], ARGV[8])
  return {state, '', now}
end
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
redis.call('HSET', KEYS[1], 'state', 'running', 'started_at', now, 'worker', ARGV[2])
redis.call('XADD', KEYS[2], '*', 'type', 'started',
           'data', cjson.encode({type = 'started', worker = ARGV[2], queued_s = tonumber(queued)}))
return {'started', submitted, now}
"""
)
