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
local DEFAULT_WEBHOOK_EVENT = 'terminal'
local State = {QUEUED = 'queued', RUNNING = 'running', ERROR = 'error'}
local Field = {
  STATE = 'state', SUBMITTED_AT = 'submitted_at', WORKER = 'worker', DELIVERIES = 'deliveries',
  HANDOFF = 'handoff', RESUMED_AT = 'resumed_at', FINISHED_AT = 'finished_at',
  ERROR_CODE = 'error_code', ERROR_MESSAGE = 'error_message', WEBHOOK = 'webhook',
}
local Entry = {
  ID = 'id', PAYLOAD = 'payload', TYPE = 'type', DATA = 'data', ENTRY_ID = 'entry_id',
  DELIVERIES = 'deliveries', WORKER = 'worker',
}
local Event = {ERROR = 'error'}
local ErrorEvent = {CODE = 'code', MESSAGE = 'message'}
local Delivery = {ID = 'id', EVENT = 'event', SUBMITTED_AT = 'submitted_at'}
local Hook = {TERMINAL = 'terminal'}
local WebhookSpec = {EVENTS = 'events'}
local Answer = {
  QUEUED = 'queued', RESUMED = 'resumed', DEAD_LETTER = 'dead_letter', OWNED = 'owned',
}
local function job_key(prefix, id)
  return prefix .. ':job:' .. id
end
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
local function webhooks_key(prefix)
  return prefix .. ':webhooks'
end
local function dead_letter_key(prefix)
  return prefix .. ':dead'
end
-- A job with a webhook (the JSON that SUBMIT copied from its payload into its status hash,
-- KEYS[1]) gets a delivery entry for `event` on the webhooks stream when its webhook asks for
-- that event, in the caller's atomic step: no end is written without its delivery, nor a
-- delivery without its end. A webhook that does not decode still gets its terminal delivery,
-- which the deliverer refuses visibly (dead letter). No prefix given: nothing is enqueued.
local function enqueue_webhook(prefix, event)
  if not prefix or prefix == '' then return end
  local f = redis.call('HMGET', KEYS[1], Field.WEBHOOK, Field.SUBMITTED_AT)
  if not f[1] then return end
  local ok, hook = pcall(cjson.decode, f[1])
  local events = ok and type(hook) == 'table' and hook[WebhookSpec.EVENTS]
  if type(events) ~= 'table' then events = {DEFAULT_WEBHOOK_EVENT} end
  for _, wanted in ipairs(events) do
    if wanted == event then
      local id = string.sub(KEYS[1], #job_key(prefix, '') + 1)
      redis.call('XADD', webhooks_key(prefix), '*', Delivery.ID, id, Delivery.EVENT, event,
                 Delivery.SUBMITTED_AT, f[2] or '')
      return
    end
  end
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
  -- The prefix, for the webhooks stream, from the dead-letter stream's name (KEYS[4]).
  enqueue_webhook(string.sub(KEYS[4], 1, #KEYS[4] - #dead_letter_key('')), Hook.TERMINAL)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', DEAD_LETTER_MAXLEN, '*', Entry.ID, ARGV[8],
             Entry.ENTRY_ID, ARGV[7], Entry.PAYLOAD, ARGV[9], Entry.DELIVERIES, n,
             Entry.WORKER, ARGV[2])
  drop_entry(ARGV[6], ARGV[7])
  return {Answer.DEAD_LETTER, n}
end
redis.call('HSET', KEYS[1], Field.WORKER, ARGV[1], Field.RESUMED_AT, now)
return {Answer.RESUMED, n}
