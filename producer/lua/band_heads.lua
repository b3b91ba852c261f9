-- BAND_HEADS: every band's head entry (its oldest not yet delivered to the workers' group) and
-- the priority of that head's job, read in one round trip for the band reader's aging
-- (`worker.service.bands`). Read only: nothing is written.
-- KEYS: the band streams (`Keys.job_streams`), most urgent first.
-- ARGV: the consumer group (`Keys.group`), the key prefix (`Keys.prefix`: the status hashes).
-- Returns {now, id_1, priority_1, id_2, priority_2, ...}: Redis' clock ("sec.micro"), then for
-- each stream its head's entry id and its job's priority from the status hash ('' for a band
-- with no undelivered entry; priority '' for a job without a status hash, enqueued by hand).
-- A stream without the group reads from its start, as XREADGROUP would once it is created.

-- Generated from the Python declarations (producer.scripts.write_files); do not edit.
local Field = {PRIORITY = 'priority'}
local Entry = {ID = 'id'}
local function job_key(prefix, id)
  return prefix .. ':job:' .. id
end
-- Seconds as "sec.micro" from Redis' clock (TIME's microseconds zero-padded to six digits),
-- so every timing of a job, whoever measures it, shares one clock.
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
-- End of the generated lines.

local function last_delivered(stream)
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then return nil end
  for _, group in ipairs(groups) do
    local info = {}
    for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
    if info['name'] == ARGV[1] then return info['last-delivered-id'] end
  end
  return nil
end

local reply = {now}
for _, stream in ipairs(KEYS) do
  local last = last_delivered(stream)
  local head = redis.call('XRANGE', stream, last and ('(' .. last) or '-', '+', 'COUNT', 1)[1]
  local id, priority = '', ''
  if head then
    id = head[1]
    local fields = head[2]
    for i = 1, #fields, 2 do
      if fields[i] == Entry.ID then
        priority = redis.call('HGET', job_key(ARGV[2], fields[i + 1]), Field.PRIORITY) or ''
      end
    end
  end
  reply[#reply + 1] = id
  reply[#reply + 1] = priority
end
return reply
