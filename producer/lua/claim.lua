-- CLAIM: a worker takes a job it read from a jobs stream.
-- KEYS: the status hash, the events stream, the jobs stream the entry was read from (its
--   band's).
-- ARGV: action ("start" | "reject"), worker name, deadline ("" or unix seconds), ttl_s, the
--   error event's JSON (for "reject"), the expired event's JSON, consumer group, the job's
--   entry id in the jobs stream, key prefix (`Keys.prefix`, for the load keys: see `unload`),
--   the started event's JSON (for "start"; its queued_s is set here, on Redis' clock).
-- A queued job that leaves "queued" here (started, rejected, expired) gives back its load. A
-- worker that omits the prefix leaves the load counted.
-- Only a job that is queued (or has no status hash: enqueued by hand with XADD) can be taken;
-- anything else (cancelled while queued, a duplicate entry) returns its state and is skipped.
-- A claim retried by the same worker for the same entry (its reply was lost to a connection
-- error) answers "started" again with the original times, so the job is not stranded.
-- Every answer but "started" ends the job's delivery here: its entry is acknowledged after the
-- terminal event is written, in the same atomic step, and deleted (the jobs stream holds only
-- jobs not yet ended, so it needs no trimming that could drop a pending one).
-- Returns {answer, submitted_at, now}: "started" | "rejected" | "expired" | the job's state.

-- Generated from the Python declarations (producer.scripts.write_files); do not edit.
local DEFAULT_WEBHOOK_EVENT = 'terminal'
local State = {QUEUED = 'queued', RUNNING = 'running', ERROR = 'error', EXPIRED = 'expired'}
local Field = {
  STATE = 'state', SUBMITTED_AT = 'submitted_at', TENANT = 'tenant', BAND = 'band',
  COST_TOKENS = 'cost_tokens', STARTED_AT = 'started_at', WORKER = 'worker',
  DELIVERIES = 'deliveries', ENTRY_ID = 'entry_id', FINISHED_AT = 'finished_at',
  ERROR_CODE = 'error_code', ERROR_MESSAGE = 'error_message', WEBHOOK = 'webhook',
}
local Entry = {TYPE = 'type', DATA = 'data'}
local Event = {ERROR = 'error', EXPIRED = 'expired', STARTED = 'started'}
local Kind = {JOBS = 'jobs', TOKENS = 'tokens'}
local Action = {REJECT = 'reject'}
local StartedEvent = {QUEUED_S = 'queued_s'}
local ErrorEvent = {CODE = 'code', MESSAGE = 'message'}
local Delivery = {ID = 'id', EVENT = 'event', SUBMITTED_AT = 'submitted_at'}
local Hook = {TERMINAL = 'terminal', STARTED = 'started'}
local WebhookSpec = {EVENTS = 'events'}
local Answer = {STARTED = 'started', REJECTED = 'rejected', EXPIRED = 'expired'}
local function job_key(prefix, id)
  return prefix .. ':job:' .. id
end
local function band_load_key(prefix, band)
  return prefix .. ':load:band:' .. band
end
local function tenant_load_key(prefix, tenant)
  return prefix .. ':load:tenant:' .. tenant
end
-- Seconds as "sec.micro" from Redis' clock (TIME's microseconds zero-padded to six digits),
-- so every timing of a job, whoever measures it, shares one clock.
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
-- A job leaving "queued" gives back what SUBMIT counted, once (the callers check the state
-- first, and only SUBMIT sets the band field, so a job enqueued with a bare XADD or by hand
-- never counted and gives back nothing). The load keys depend on the hash's band and tenant,
-- which only the script reads atomically, so it names them itself from the key prefix (ARGV),
-- as `Keys.band_load` / `Keys.tenant_load` do (generated from them): keys not passed in KEYS
-- are not cluster-safe, which holds for the whole protocol (one single-node Redis).
local function unload(prefix)
  local f = redis.call('HMGET', KEYS[1], Field.BAND, Field.TENANT, Field.COST_TOKENS)
  if not prefix or prefix == '' or not f[1] then return end
  local cost = tonumber(f[3] or '0')
  for _, key in ipairs({band_load_key(prefix, f[1]), tenant_load_key(prefix, f[2])}) do
    redis.call('HINCRBY', key, Kind.JOBS, -1)
    redis.call('HINCRBY', key, Kind.TOKENS, -cost)
  end
end
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

if ARGV[1] ~= Action.REJECT and (ARGV[10] or '') == '' then
  return redis.error_reply('ERR CLAIM: ARGV[10], the started event, is missing')
end
local state = redis.call('HGET', KEYS[1], Field.STATE)
local mine = redis.call('HMGET', KEYS[1], Field.WORKER, Field.ENTRY_ID, Field.SUBMITTED_AT,
                        Field.STARTED_AT)
if state == State.RUNNING and mine[1] == ARGV[2] and mine[2] == ARGV[8] then
  return {Answer.STARTED, mine[3], mine[4]}  -- this worker's claim again, its first reply lost
end
if state and state ~= State.QUEUED then
  drop_entry(ARGV[7], ARGV[8])
  return {state, '', now}
end
if state then unload(ARGV[9]) end
local submitted = redis.call('HGET', KEYS[1], Field.SUBMITTED_AT)
if not submitted then
  submitted = now
  redis.call('HSET', KEYS[1], Field.SUBMITTED_AT, now)
end
local function finish(final, event_type, data)
  redis.call('HSET', KEYS[1], Field.WORKER, ARGV[2])
  end_job(final, event_type, data, ARGV[4])
  enqueue_webhook(ARGV[9], Hook.TERMINAL)
  drop_entry(ARGV[7], ARGV[8])
end
if ARGV[1] == Action.REJECT then
  local err = cjson.decode(ARGV[5])
  redis.call('HSET', KEYS[1], Field.ERROR_CODE, err[ErrorEvent.CODE],
             Field.ERROR_MESSAGE, err[ErrorEvent.MESSAGE])
  finish(State.ERROR, Event.ERROR, ARGV[5])
  return {Answer.REJECTED, submitted, now}
end
if ARGV[3] ~= '' and tonumber(now) > tonumber(ARGV[3]) then
  finish(State.EXPIRED, Event.EXPIRED, ARGV[6])
  return {Answer.EXPIRED, submitted, now}
end
local started = cjson.decode(ARGV[10])
local queued = string.format('%.6f', tonumber(now) - tonumber(submitted))
started[StartedEvent.QUEUED_S] = tonumber(queued)
redis.call('HSET', KEYS[1], Field.STATE, State.RUNNING, Field.STARTED_AT, now,
           Field.WORKER, ARGV[2], Field.DELIVERIES, 1, Field.ENTRY_ID, ARGV[8])
redis.call('XADD', KEYS[2], '*', Entry.TYPE, Event.STARTED, Entry.DATA, cjson.encode(started))
enqueue_webhook(ARGV[9], Hook.STARTED)
return {Answer.STARTED, submitted, now}
