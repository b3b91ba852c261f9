-- RECLAIM: a worker takes over a running job whose worker stopped renewing its lease (it
-- died, or was stopped and handed the job back), after XCLAIMing its jobs-stream entry.
-- KEYS: the status hash, the events stream, the entry's jobs stream, the dead-letter stream.
-- ARGV: this worker, the old worker (the entry's consumer), max deliveries, ttl_s, the error
--   event's JSON (dead letter; `{deliveries}` in its message becomes the count), consumer
--   group, entry id, job id, the entry's payload.
-- A job handed back by a graceful stop (its handoff field) is not counted as a failed
-- delivery; any other takeover is, and past max deliveries the job ends with the error event
-- and goes to the dead-letter stream: a job that kills every worker running it stops there.
-- Returns {answer, deliveries}: "resumed" (continue it from its events), "queued" (never
-- started: take it as a new job), "dead_letter", "owned" (another worker runs it now), or the
-- terminal state it already reached (the old worker died after the end, before the ack).

-- Generated from the Python declarations (producer.scripts.write_files); do not edit.
local DEAD_LETTER_MAXLEN = 10000
local DELIVERIES_MARK = '{deliveries}'
local State = {QUEUED = 'queued', RUNNING = 'running', ERROR = 'error'}
local Field = {
  STATE = 'state', WORKER = 'worker', DELIVERIES = 'deliveries', HANDOFF = 'handoff',
  RESUMED_AT = 'resumed_at', FINISHED_AT = 'finished_at', ERROR_CODE = 'error_code',
  ERROR_MESSAGE = 'error_message',
}
local Entry = {
  ID = 'id', PAYLOAD = 'payload', TYPE = 'type', DATA = 'data', ENTRY_ID = 'entry_id',
  DELIVERIES = 'deliveries', WORKER = 'worker',
}
local Event = {ERROR = 'error'}
local ErrorEvent = {CODE = 'code', MESSAGE = 'message'}
local Answer = {
  QUEUED = 'queued', RESUMED = 'resumed', DEAD_LETTER = 'dead_letter', OWNED = 'owned',
}
-- Seconds as "sec.micro" from Redis' clock (TIME's microseconds zero-padded to six digits),
-- so every timing of a job, whoever measures it, shares one clock.
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
-- A job ends: its state and end time in the status hash (KEYS[1]), its terminal event on its
-- events stream (KEYS[2]), and both expire ttl_s after the end.
local function end_job(final, event_type, data, ttl_s)
  redis.call('HSET', KEYS[1], Field.STATE, final, Field.FINISHED_AT, now)
  redis.call('XADD', KEYS[2], '*', Entry.TYPE, event_type, Entry.DATA, data)
  redis.call('EXPIRE', KEYS[1], ttl_s)
  redis.call('EXPIRE', KEYS[2], ttl_s)
end
-- A job's delivery ends: its entry in the jobs stream it was read from (KEYS[3]) is
-- acknowledged and deleted, so the stream holds only jobs not yet ended and needs no trimming
-- that could drop a pending one.
local function drop_entry(group, entry_id)
  redis.call('XACK', KEYS[3], group, entry_id)
  redis.call('XDEL', KEYS[3], entry_id)
end
-- End of the generated lines.

local state = redis.call('HGET', KEYS[1], Field.STATE)
if not state or state == State.QUEUED then return {Answer.QUEUED, 0} end
if state ~= State.RUNNING then
  drop_entry(ARGV[6], ARGV[7])
  return {state, 0}
end
if redis.call('HGET', KEYS[1], Field.WORKER) ~= ARGV[2] then return {Answer.OWNED, 0} end
local n = tonumber(redis.call('HGET', KEYS[1], Field.DELIVERIES) or '1')
if redis.call('HGET', KEYS[1], Field.HANDOFF) == '1' then
  redis.call('HDEL', KEYS[1], Field.HANDOFF)
else
  n = redis.call('HINCRBY', KEYS[1], Field.DELIVERIES, 1)
end
if n > tonumber(ARGV[3]) then
  -- The message counts the deliveries that happened (n - 1 workers ran it), not the setting.
  local err = cjson.decode(ARGV[5])
  local message = string.gsub(err[ErrorEvent.MESSAGE], DELIVERIES_MARK, tostring(n - 1))
  err[ErrorEvent.MESSAGE] = message
  redis.call('HSET', KEYS[1], Field.WORKER, ARGV[1], Field.ERROR_CODE, err[ErrorEvent.CODE],
             Field.ERROR_MESSAGE, message)
  end_job(State.ERROR, Event.ERROR, cjson.encode(err), ARGV[4])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', DEAD_LETTER_MAXLEN, '*', Entry.ID, ARGV[8],
             Entry.ENTRY_ID, ARGV[7], Entry.PAYLOAD, ARGV[9], Entry.DELIVERIES, n,
             Entry.WORKER, ARGV[2])
  drop_entry(ARGV[6], ARGV[7])
  return {Answer.DEAD_LETTER, n}
end
redis.call('HSET', KEYS[1], Field.WORKER, ARGV[1], Field.RESUMED_AT, now)
return {Answer.RESUMED, n}
