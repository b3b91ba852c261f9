-- A job's delivery ends: its entry in the jobs stream it was read from (KEYS[3]) is
-- acknowledged and deleted, so the stream holds only jobs not yet ended and needs no trimming
-- that could drop a pending one.
local function drop_entry(group, entry_id)
  redis.call('XACK', KEYS[3], group, entry_id)
  redis.call('XDEL', KEYS[3], entry_id)
end
