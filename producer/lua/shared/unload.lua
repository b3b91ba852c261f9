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
