-- A job ends: its state and end time in the status hash (KEYS[1]), its terminal event on its
-- events stream (KEYS[2]), and both expire ttl_s after the end.
local function end_job(final, event_type, data, ttl_s)
  redis.call('HSET', KEYS[1], Field.STATE, final, Field.FINISHED_AT, now)
  redis.call('XADD', KEYS[2], '*', Entry.TYPE, event_type, Entry.DATA, data)
  redis.call('EXPIRE', KEYS[1], ttl_s)
  redis.call('EXPIRE', KEYS[2], ttl_s)
end
