-- SUBMIT: admission and enqueue in one step, so concurrent producers never overshoot a limit.
-- KEYS: the status hash (`Keys.job`), the job's band stream (`Keys.band`), the band's load
--   hash (`Keys.band_load`), the tenant's load hash (`Keys.tenant_load`), the limits hash
--   (`Keys.limits`), the recent list (`Keys.recent`).
-- ARGV: job id, payload (the JobSpec JSON), priority, tenant, band, cost in tokens
--   (`admission.estimate_cost_tokens`).
-- The script derives the id, priority, tenant, band and cost from the payload, and every key
-- from them and KEYS[1]'s prefix; a call whose ARGV or KEYS disagree is refused with an error
-- naming the first that does (nothing written), so the status hash and the load counts always
-- say what the job is, and CANCEL and CLAIM give back exactly what was counted. Decoding holds
-- Redis for about 4 ms per MiB of prompt text, 15 ms per MiB of token ids (150,000 ids); a
-- payload of a few KB costs no measurable time (Redis 7, one core of the dev machine).
-- Limits are fields `<scope>:<kind>` of the limits hash (scope `band:<band>`, `tenant:<name>`,
-- or `tenant:*` for tenants without their own; kind `jobs` or `tokens`); a missing field is no
-- limit. A job is refused when it would take its scope past a limit; a tokens limit is not
-- applied to a scope with nothing queued, or a job costing more than the limit would be
-- refused forever (so a scope holds at most max(limit, one job's cost) tokens). Jobs limit 0
-- closes it.
-- Returns {1, stream id} when enqueued, {0, stream id of the existing job} when the id exists
-- (nothing counted again), {-1, scope, kind, current, limit} when a limit refused it (nothing
-- written).

-- Generated from the Python declarations (producer.scripts.write_files); do not edit.
local RECENT_KEPT = 100
local BYTES_PER_TOKEN = 4
local TOKENS_PER_MESSAGE = 4
local DEFAULT_PRIORITY = 0
local DEFAULT_TENANT = 'default'
local DEFAULT_MAX_TOKENS = 16
local DEFAULT_N = 1
local ANY_TENANT_SCOPE = 'tenant:*'
local State = {QUEUED = 'queued'}
local Field = {
  STATE = 'state', SUBMITTED_AT = 'submitted_at', PRIORITY = 'priority', TENANT = 'tenant',
  STREAM_ID = 'stream_id', BAND = 'band', COST_TOKENS = 'cost_tokens', WEBHOOK = 'webhook',
}
local Entry = {ID = 'id', PAYLOAD = 'payload'}
local Kind = {JOBS = 'jobs', TOKENS = 'tokens'}
local JobSpec = {
  ID = 'id', PROMPT = 'prompt', MESSAGES = 'messages', PROMPT_TOKEN_IDS = 'prompt_token_ids',
  SAMPLING = 'sampling', PRIORITY = 'priority', TENANT = 'tenant', WEBHOOK = 'webhook',
}
local SamplingSpec = {MAX_TOKENS = 'max_tokens', N = 'n'}
local ChatMessage = {CONTENT = 'content'}
local function job_key(prefix, id)
  return prefix .. ':job:' .. id
end
local function band_stream(prefix, band)
  local cases = {
    interactive = prefix .. ':jobs:interactive',
    default = prefix .. ':jobs',
    batch = prefix .. ':jobs:batch',
  }
  return cases[band]
end
local function band_load_key(prefix, band)
  return prefix .. ':load:band:' .. band
end
local function tenant_load_key(prefix, tenant)
  return prefix .. ':load:tenant:' .. tenant
end
local function limits_key(prefix)
  return prefix .. ':limits'
end
local function recent_key(prefix)
  return prefix .. ':recent'
end
local function band_of(priority)
  if priority >= 10 then return 'batch' end
  if priority >= 0 then return 'default' end
  return 'interactive'
end
local function band_scope(band)
  local cases = {
    interactive = 'band:interactive',
    default = 'band:default',
    batch = 'band:batch',
  }
  return cases[band]
end
local function tenant_scope(tenant)
  return 'tenant:' .. tenant
end
local function limit_field(scope, kind)
  return scope .. ':' .. kind
end
-- Seconds as "sec.micro" from Redis' clock (TIME's microseconds zero-padded to six digits),
-- so every timing of a job, whoever measures it, shares one clock.
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
-- End of the generated lines.

-- A payload field: absent or null gives the default; a value of another type is refused.
local function get(object, name, kind, default)
  local value = object[name]
  if value == nil or value == cjson.null then return default end
  if type(value) ~= kind then error('the payload\'s ' .. name .. ' is not a ' .. kind, 0) end
  return value
end
-- The cost as `admission.estimate_cost_tokens` counts it (a test holds the two equal): the
-- prompt (its token ids, else ceil(UTF-8 bytes / BYTES_PER_TOKEN) of its text, or of the
-- messages' contents plus TOKENS_PER_MESSAGE each) plus max_tokens for each of n choices.
local function cost_of(spec)
  local sampling = get(spec, JobSpec.SAMPLING, 'table', {})
  local new = get(sampling, SamplingSpec.MAX_TOKENS, 'number', DEFAULT_MAX_TOKENS)
    * get(sampling, SamplingSpec.N, 'number', DEFAULT_N)
  local ids = get(spec, JobSpec.PROMPT_TOKEN_IDS, 'table', nil)
  if ids then return #ids + new end
  local messages = get(spec, JobSpec.MESSAGES, 'table', nil)
  if messages then
    local bytes = 0
    for _, m in ipairs(messages) do
      if type(m) ~= 'table' then error('the payload\'s messages are not all objects', 0) end
      bytes = bytes + #get(m, ChatMessage.CONTENT, 'string', '')
    end
    return math.ceil(bytes / BYTES_PER_TOKEN) + TOKENS_PER_MESSAGE * #messages + new
  end
  return math.ceil(#get(spec, JobSpec.PROMPT, 'string', '') / BYTES_PER_TOKEN) + new
end
-- Raises naming the first ARGV or KEYS entry that disagrees with the payload. Numbers are
-- compared as the decimals Python writes (exact below 2^53: Lua's numbers are doubles).
local function check_call()
  local ok, spec = pcall(cjson.decode, ARGV[2])
  if not ok or type(spec) ~= 'table' then error('the payload is not a JSON object', 0) end
  local id = get(spec, JobSpec.ID, 'string', nil)
  if not id then error('the payload has no id', 0) end
  local priority = get(spec, JobSpec.PRIORITY, 'number', DEFAULT_PRIORITY)
  if priority ~= math.floor(priority) then error('the payload\'s priority is no integer', 0) end
  local tenant = get(spec, JobSpec.TENANT, 'string', DEFAULT_TENANT)
  local band = band_of(priority)
  local prefix = string.sub(KEYS[1] or '', 1, #(KEYS[1] or '') - #job_key('', id))
  local want = {
    {'ARGV[1] (job id)', ARGV[1], id},
    {'ARGV[3] (priority)', ARGV[3], string.format('%.0f', priority)},
    {'ARGV[4] (tenant)', ARGV[4], tenant},
    {'ARGV[5] (band)', ARGV[5], band},
    {'ARGV[6] (cost)', ARGV[6], string.format('%.0f', cost_of(spec))},
    {'KEYS[1]', KEYS[1], job_key(prefix, id)},
    {'KEYS[2]', KEYS[2], band_stream(prefix, band)},
    {'KEYS[3]', KEYS[3], band_load_key(prefix, band)},
    {'KEYS[4]', KEYS[4], tenant_load_key(prefix, tenant)},
    {'KEYS[5]', KEYS[5], limits_key(prefix)},
    {'KEYS[6]', KEYS[6], recent_key(prefix)},
  }
  for _, w in ipairs(want) do
    if w[2] ~= w[3] then
      error(w[1] .. ' is ' .. cjson.encode(w[2] or '') .. '; the payload makes it '
        .. cjson.encode(w[3]), 0)
    end
  end
  return spec
end
local checked, spec = pcall(check_call)
if not checked then return redis.error_reply('ERR SUBMIT refused: ' .. tostring(spec)) end

if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], Field.STREAM_ID) or ''}
end
local cost = tonumber(ARGV[6])
local function limit_of(scope, fallback, kind)
  local limit = redis.call('HGET', KEYS[5], limit_field(scope, kind))
  if not limit and fallback then
    limit = redis.call('HGET', KEYS[5], limit_field(fallback, kind))
  end
  return tonumber(limit)
end
local function over(load_key, scope, fallback)
  local jobs = tonumber(redis.call('HGET', load_key, Kind.JOBS) or '0')
  local tokens = tonumber(redis.call('HGET', load_key, Kind.TOKENS) or '0')
  local limit = limit_of(scope, fallback, Kind.JOBS)
  if limit and jobs + 1 > limit then return {-1, scope, Kind.JOBS, jobs, limit} end
  limit = limit_of(scope, fallback, Kind.TOKENS)
  if limit and jobs > 0 and tokens + cost > limit then
    return {-1, scope, Kind.TOKENS, tokens, limit}
  end
  return nil
end
local refused = over(KEYS[3], band_scope(ARGV[5]), nil)
  or over(KEYS[4], tenant_scope(ARGV[4]), ANY_TENANT_SCOPE)
if refused then return refused end
local sid = redis.call('XADD', KEYS[2], '*', Entry.ID, ARGV[1], Entry.PAYLOAD, ARGV[2])
redis.call('HSET', KEYS[1], Field.STATE, State.QUEUED, Field.SUBMITTED_AT, now,
           Field.PRIORITY, ARGV[3], Field.TENANT, ARGV[4], Field.STREAM_ID, sid,
           Field.BAND, ARGV[5], Field.COST_TOKENS, ARGV[6])
-- The webhook, which the scripts that end or start the job read to enqueue its delivery.
if type(spec[JobSpec.WEBHOOK]) == 'table' then
  redis.call('HSET', KEYS[1], Field.WEBHOOK, cjson.encode(spec[JobSpec.WEBHOOK]))
end
for _, key in ipairs({KEYS[3], KEYS[4]}) do
  redis.call('HINCRBY', key, Kind.JOBS, 1)
  redis.call('HINCRBY', key, Kind.TOKENS, cost)
end
redis.call('LPUSH', KEYS[6], ARGV[1])
redis.call('LTRIM', KEYS[6], 0, RECENT_KEPT - 1)
return {1, sid}
