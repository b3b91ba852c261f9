-- CANCEL: a queued job ends here and now; a running one is flagged and its worker told
-- through the cancels stream.
-- KEYS: the status hash, the events stream, the cancels stream (`Keys.cancels`).
-- ARGV: job id, ttl_s, the cancelled event's JSON, key prefix (`Keys.prefix`, for the load
--   keys: see `unload`).
-- Returns "cancelled", "cancelling", "missing" or the terminal state the job already had.

-- Generated from the Python declarations (producer.scripts.write_files); do not edit.
local CANCELS_MAXLEN = 10000
local DEFAULT_WEBHOOK_EVENT = 'terminal'
local State = {QUEUED = 'queued', RUNNING = 'running', CANCELLED = 'cancelled'}
local Field = {
  STATE = 'state', SUBMITTED_AT = 'submitted_at', TENANT = 'tenant', BAND = 'band',
  COST_TOKENS = 'cost_tokens', FINISHED_AT = 'finished_at', CANCEL_REQUESTED = 'cancel_requested',
  WEBHOOK = 'webhook',
}
local Entry = {ID = 'id', TYPE = 'type', DATA = 'data'}
local Event = {CANCELLED = 'cancelled'}
local Kind = {JOBS = 'jobs', TOKENS = 'tokens'}
local Delivery = {ID = 'id', EVENT = 'event', SUBMITTED_AT = 'submitted_at'}
local Hook = {TERMINAL = 'terminal'}
local WebhookSpec = {EVENTS = 'events'}
local Answer = {CANCELLED = 'cancelled', CANCELLING = 'cancelling', MISSING = 'missing'}
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

local state = redis.call('HGET', KEYS[1], Field.STATE)
if not state then return Answer.MISSING end
if state == State.QUEUED then
  unload(ARGV[4])
  end_job(State.CANCELLED, Event.CANCELLED, ARGV[3], ARGV[2])
  enqueue_webhook(ARGV[4], Hook.TERMINAL)
  return Answer.CANCELLED
end
if state == State.RUNNING then
  redis.call('HSET', KEYS[1], Field.CANCEL_REQUESTED, '1')
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', CANCELS_MAXLEN, '*', Entry.ID, ARGV[1])
  return Answer.CANCELLING
end
return state
