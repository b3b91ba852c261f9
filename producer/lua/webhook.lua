-- WEBHOOK: the worker's enqueue of a job's webhook delivery, run inside the MULTI that writes
-- the event it reports (the worker's terminal events go through its publisher, not a script).
-- KEYS: the status hash. ARGV: key prefix, event ("terminal" | "started").
-- Returns 0.

-- Generated from the Python declarations (producer.scripts.write_files); do not edit.
local DEFAULT_WEBHOOK_EVENT = 'terminal'
local Field = {SUBMITTED_AT = 'submitted_at', WEBHOOK = 'webhook'}
local Delivery = {ID = 'id', EVENT = 'event', SUBMITTED_AT = 'submitted_at'}
local WebhookSpec = {EVENTS = 'events'}
local function job_key(prefix, id)
  return prefix .. ':job:' .. id
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

enqueue_webhook(ARGV[1], ARGV[2])
return 0
