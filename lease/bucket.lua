-- The regional allocator contract (DESIGN.md, "Level 1") for one key.
-- bucket.go holds the same arithmetic in Go for MemoryStore: keep the two
-- in step, expression for expression, so both stores round alike.
--
-- A key's state (redis_state.go reads and writes it for Go) is a binary
-- string, little endian, in one of two forms:
--   short (exactly 12 bytes): tokens (double), then d (uint32): last =
--     expiry × 1000 − d µs. Only for a token bucket without a share, whose
--     state expires with its bucket.
--   long: flags (byte: 1 w, 2 share, 4 escrow, 8 escrow window), tokens
--     (double), last (µs, uint56), then as flagged: w (a fixed window's
--     start, µs, uint56); the applied share (ppm, uint24) and the bucket's
--     own expiry (ms, uint48, 0 never); the escrow's generation and tokens
--     credited in its era (thousandths, uint56 each); the escrow's fixed
--     window (µs, uint56).
-- Without a share the state expires when its bucket would be full again.
-- With one (exchange state) it lives at least ShareTTL (ARGV[15]) from the
-- latest share write and never less than its bucket: once the bucket's own
-- expiry has passed, the bucket counts as missing and the share stays.
--
-- It lives in one of two places (redis_group.go), as ARGV[16] says:
--   the key's own Redis key (layout "k"), expiring with the state;
--   a field (ARGV[17]) of the key's group, a hash (layout "g"), whose value
--     is the state's expiry (ms, uint48, 0 never) then the state. An
--     expired value reads as missing. The group expires with its latest
--     field (PEXPIREAT GT; never while a field never expires), and each
--     write checks three fields at random and deletes those expired.
-- KEYS[1]  the state's place in this layout: the key's Redis key, or its
--          group
-- KEYS[2]  its place in the other layout: read when KEYS[1] holds no live
--          state, and the state deleted there once it moved to KEYS[1], so
--          that replicas running different layouts (while a region switches)
--          never hold a bucket twice
-- KEYS[3]  the bucket before issue 12, a hash {tokens, last, w}: read when
--          neither place holds the key, and deleted once its state moved.
-- KEYS[4]  the share before issue 12, "share" or "share:gen:window:
--          credited": read while the state holds no share (in layout "g",
--          only when the state was not in its group). A share write moves
--          it into the state and deletes it, and so does any write in layout
--          "g". Layout "k" gives it a TTL of ShareTTL if it has none, so
--          that a lost DeleteShares ends.
--          All four lie in one Cluster slot (the key's hash tag, and a
--          group tag chosen in that slot).
-- ARGV[1]  op: "g" grant, "r" return, "s" set share, "d" delete share
-- ARGV[2]  L, the key's global rate (tokens/s)
-- ARGV[3]  b, the key's global burst (tokens)
-- ARGV[4]  cost (tokens)
-- ARGV[5]  initial share in ppm, used while the key holds no share
-- ARGV[6]  "1" when a missing bucket starts empty, else "0"
-- ARGV[7]  g: tokens wanted; r: tokens returned; s: the new share in ppm
-- ARGV[8]  s: the exchange generation of ARGV[9] (0: no tokens)
-- ARGV[9]  s: tokens received in that generation, cumulative, thousandths
-- ARGV[10] s: the fixed window (start, µs) of ARGV[9]; 0 for a bucket
-- ARGV[11..14] a fixed window's boundaries in µs (previous start, start,
--          end, next end); all 0 for a token bucket
-- ARGV[15] ShareTTL in ms
-- ARGV[16] the layout: "k" own keys, "g" groups
-- ARGV[17] the key's field in its group
-- ARGV[18] g: the most share in ppm to grant at (GrantRequest.MaxShare);
--          0 or absent: no cap. A share above it is set to it first.
-- ARGV[19] g, s: the steps of a raise (GrantRequest.Raise) or before a
--          share (ShareUpdate.Steps), 0 or absent: none; then for each,
--          oldest first, the share in ppm and its age in µs. Each is set as
--          a share write that long before now would have (never before the
--          bucket's last update), what it releases dropped; a raise's last
--          as "s" would with ARGV[8..10].
--
-- Returns {granted (s: tokens released, thousandths), tokens left as a
-- %.17g string, share in ppm in force, µs to a fixed window's end (0 for a
-- bucket), the fixed window's start (0 for a bucket)}; "d" returns zeros.
-- Arguments are validated by the Go caller before they are sent.
--
-- Time is the server's own (TIME), never the caller's. Redis >= 5 replicates
-- a script's effects rather than the script, so reading TIME (and
-- HRANDFIELD) is allowed and replicas apply the same values; older servers
-- need replicate_commands. PEXPIRETIME, SET PXAT and PEXPIREAT GT need
-- Redis >= 7.0.
if redis.replicate_commands then
  redis.replicate_commands()
end

local op = ARGV[1]
local shareTTL = tonumber(ARGV[15])
local grouped = ARGV[16] == 'g'
local field = ARGV[17]
local keyName, groupName = KEYS[1], KEYS[2]
if grouped then
  keyName, groupName = KEYS[2], KEYS[1]
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local nowms = math.floor(now / 1000)

local function bad(what, at)
  -- Written by something other than this script: refuse rather than
  -- grant at a rate the exchange never agreed to.
  return redis.error_reply('ERR ration: bad ' .. what .. ' at ' .. at)
end

local function flag(f, bit)
  return math.floor(f / bit) % 2 == 1
end

-- The key's state. have: a live bucket (tokens, last, win); folded: the
-- state holds a share (share, bexp, and the escrow sgen, swin, scred).
local have, tokens, last, win = false, 0, 0, 0
local folded, share, bexp, sgen, swin, scred = false, nil, 0, 0, 0, 0
-- found: where the state was, "key", "group" or "old" (KEYS[3]); curexp:
-- its expiry (ms, 0 never; nil: the key's PEXPIRETIME, not read yet);
-- gexp: the expiry of the key's field in its group, if it has one (read
-- only when looked for; an expired field has one too).
local found, curexp, gexp = nil, nil, nil

-- pexpiretime is a key's expiry in ms, 0 for never (or missing).
local function pexpiretime(k)
  local e = redis.call('PEXPIRETIME', k)
  if e < 0 then
    return 0
  end
  return e
end

-- decode reads a state from raw at pos; e is the expiry of what holds it
-- (ms, 0 never), which only the short form needs.
local function decode(raw, pos, e, at)
  local n = #raw - pos + 1
  if n == 12 then
    if e <= 0 then
      return bad('state', at)
    end
    local d
    tokens, d = struct.unpack('<dI4', raw, pos)
    have, last = true, e * 1000 - d
    return nil
  end
  local f = string.byte(raw, pos)
  if not f or f > 15 or n ~= 16 + (f % 2) * 7 + (math.floor(f / 2) % 2) * 9 + (math.floor(f / 4) % 2) * 14 + (math.floor(f / 8) % 2) * 7 then
    return bad('state', at)
  end
  local p
  tokens, last, p = struct.unpack('<dI7', raw, pos + 1)
  if flag(f, 1) then
    win, p = struct.unpack('<I7', raw, p)
  end
  if flag(f, 2) then
    folded = true
    share, bexp, p = struct.unpack('<I3I6', raw, p)
    if share > 1000000 then
      return bad('share', at)
    end
  end
  if flag(f, 4) then
    sgen, scred, p = struct.unpack('<I7I7', raw, p)
  end
  if flag(f, 8) then
    swin = struct.unpack('<I7', raw, p)
  end
  -- Only a share keeps the state past its bucket's expiry (expired(), as
  -- Redis decides it).
  have = not folded or bexp == 0 or nowms <= bexp
  return nil
end

local function readKey()
  local raw = redis.call('GET', keyName)
  if not raw then
    return nil
  end
  found = 'key'
  if #raw == 12 then
    curexp = pexpiretime(keyName)
  end
  return decode(raw, 1, curexp or 0, keyName)
end

local function readGroup()
  -- Not HGET: Redis reuses a script's argument objects by position, and
  -- SET stores its value (the third) as it is, so a 21-byte key there
  -- before would make a 12-byte state cost 48 B rather than 32. The field
  -- "" never exists (keys are not empty).
  local raw = redis.call('HMGET', groupName, '', field)[2]
  if not raw then
    return nil
  end
  if #raw < 7 then
    return bad('state', groupName)
  end
  gexp = struct.unpack('<I6', raw)
  local err = decode(raw, 7, gexp, groupName)
  if err or gexp == 0 or nowms <= gexp then
    found, curexp = 'group', gexp
    return err
  end
  -- Expired: missing, once it was found to be ours.
  have, tokens, last, win = false, 0, 0, 0
  folded, share, bexp, sgen, swin, scred = false, nil, 0, 0, 0, 0
  return nil
end

local err
if grouped then
  err = readGroup()
  if not err and not found then
    err = readKey()
  end
else
  err = readKey()
  if not err and not found then
    err = readGroup()
  end
end
if err then
  return err
end
if not found then
  local h = redis.call('HMGET', KEYS[3], 'tokens', 'last', 'w')
  if h[1] and h[2] then
    have, found = true, 'old'
    tokens, last, win = tonumber(h[1]), tonumber(h[2]), tonumber(h[3] or '0')
  end
end

-- oldShare: the share came from KEYS[4], which expires at sexp (ms).
local oldShare, sexp = false, 0
if not folded and not (grouped and found == 'group') then
  local stored = redis.call('GET', KEYS[4])
  if stored then
    oldShare = true
    local s, g, w, c = string.match(stored, '^(%d+):(%d+):(%d+):(%d+)$')
    if s then
      share, sgen, swin, scred = tonumber(s), tonumber(g), tonumber(w), tonumber(c)
    else
      share = tonumber(stored)
    end
    if not share or share < 0 or share > 1000000 or share ~= math.floor(share) then
      return bad('share ' .. tostring(stored), KEYS[4])
    end
    if grouped then
      sexp = redis.call('PEXPIRETIME', KEYS[4])
      if sexp == -1 then
        sexp = math.ceil(now / 1000) + shareTTL
      end
    else
      redis.call('PEXPIRE', KEYS[4], shareTTL, 'NX')
    end
  end
end

-- encode is the state above (tokens, last, win) with the bucket expiring
-- at bexp, and the share if keep, in a place expiring at keyexp.
local function encode(keep, keyexp)
  if not keep and win == 0 and keyexp ~= 0 and keyexp == bexp and bexp * 1000 - last < 4294967296 then
    return struct.pack('<dI4', tokens, bexp * 1000 - last)
  end
  local f, fmt, vals = 0, '<BdI7', {0, tokens, last}
  if win ~= 0 then
    f, fmt = f + 1, fmt .. 'I7'
    vals[#vals + 1] = win
  end
  if keep then
    f, fmt = f + 2, fmt .. 'I3I6'
    vals[#vals + 1], vals[#vals + 2] = share, bexp
    if sgen > 0 then
      f, fmt = f + 4, fmt .. 'I7I7'
      vals[#vals + 1], vals[#vals + 2] = sgen, scred
      if swin ~= 0 then
        f, fmt = f + 8, fmt .. 'I7'
        vals[#vals + 1] = swin
      end
    end
  end
  vals[1] = f
  return struct.pack(fmt, unpack(vals))
end

-- rescan deletes the group's expired fields and sets its expiry to its
-- latest field's, after the one field that never expired changed: rare
-- (a share of 0 set or lifted), and as long as the group.
local function rescan()
  local all = redis.call('HGETALL', groupName)
  local latest, forever = 0, false
  for i = 1, #all, 2 do
    local v = all[i + 1]
    local e = 0 -- a value this script did not write is kept
    if #v >= 6 then
      e = struct.unpack('<I6', v)
    end
    if e == 0 then
      forever = true
    elseif nowms > e then
      redis.call('HDEL', groupName, all[i])
    elseif e > latest then
      latest = e
    end
  end
  if forever then
    redis.call('PERSIST', groupName)
  elseif latest > 0 then
    redis.call('PEXPIREAT', groupName, latest)
  end
end

-- sweep checks three fields of the group at random and deletes those
-- expired, as Redis's active expiry samples keys: a stale field is found
-- after about a third of the group's size in writes to it.
local function sweep()
  local s = redis.call('HRANDFIELD', groupName, 3, 'WITHVALUES')
  for i = 1, #s, 2 do
    local v = s[i + 1]
    if #v >= 6 then
      local e = struct.unpack('<I6', v)
      if e ~= 0 and nowms > e then
        redis.call('HDEL', groupName, s[i])
      end
    end
  end
end

local function dropGroup()
  if gexp then
    redis.call('HDEL', groupName, field)
    if gexp == 0 then
      rescan()
    end
  end
end

-- write stores the state (with the share if keep) in this layout's place,
-- expiring at keyexp (0 never), and deletes it where it was.
local function write(keep, keyexp)
  local v = encode(keep, keyexp)
  if grouped then
    local existed = gexp ~= nil or redis.call('EXISTS', groupName) == 1
    redis.call('HSET', groupName, field, struct.pack('<I6', keyexp) .. v)
    if keyexp == 0 then
      if gexp ~= 0 then
        redis.call('PERSIST', groupName)
      end
    elseif not existed then
      redis.call('PEXPIREAT', groupName, keyexp)
    else
      -- A group that never expires (a field that never does) stays so.
      redis.call('PEXPIREAT', groupName, keyexp, 'GT')
      if gexp == 0 then
        rescan()
      end
    end
    sweep()
    if found == 'key' then
      redis.call('DEL', keyName)
    end
    if oldShare then
      redis.call('DEL', KEYS[4])
    end
  else
    if keyexp ~= 0 then
      redis.call('SET', keyName, v, 'PXAT', string.format('%d', keyexp))
    else
      redis.call('SET', keyName, v)
    end
    dropGroup()
  end
  if found == 'old' then
    redis.call('DEL', KEYS[3])
  end
end

-- drop deletes the state where it was.
local function drop()
  if found == 'key' then
    redis.call('DEL', keyName)
  elseif found == 'group' then
    dropGroup()
  end
end

if op == 'd' then
  -- The key falls back to its bucket, which expires as if it had never
  -- held a share; a bucket past its expiry goes at once.
  if oldShare then
    redis.call('DEL', KEYS[4])
  end
  if folded and not have then
    drop()
  elseif folded then
    write(false, bexp)
  end
  return {0, '0', 0, 0, 0}
end

local L = tonumber(ARGV[2])
local B = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local n = tonumber(ARGV[7])
local w0, w1, w2, w3 = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local fixed = w1 > 0
if not share then
  share = tonumber(ARGV[5])
end

-- Limit.Regional: rate = L × share, capacity = max(b × share, cost).
local function regional(s)
  s = s / 1000000
  local rate = L * s
  local capacity = B * s
  if capacity < cost then
    capacity = cost
  end
  return rate, capacity
end

-- Limit.windowAt: the fixed window containing at, or nil.
local function windowAt(at)
  if at >= w1 and at < w2 then
    return w1, w2
  elseif at >= w2 and at < w3 then
    return w2, w3
  elseif at >= w0 and at < w1 then
    return w0, w1
  end
  return nil, nil
end

local rate, capacity = regional(share)

-- The steps of a raise or before a share (ARGV[19]).
local steps = 0
if (op == 'g' or op == 's') and not fixed then
  steps = tonumber(ARGV[19] or '0') or 0
end

if not have then
  -- No bucket: start the one it stands for (a share change too, so that
  -- the tokens it held at the old share are counted, not its new capacity).
  win = 0
  if fixed then
    win = windowAt(now)
    if not win then
      return redis.error_reply('ERR ration: the store clock ' .. string.format('%d', now) .. ' is outside the fixed window at ' .. KEYS[1])
    end
  end
  if ARGV[6] == '1' then
    tokens = 0
  else
    tokens = capacity
  end
  last = now
  -- A bucket past its expiry (bexp, kept with a share) was full from
  -- then on: steps set since count from the later of then and the oldest
  -- step (they only raise it above the share in force).
  if steps > 0 and folded and bexp > 0 and ARGV[6] ~= '1' then
    local from = math.max(bexp * 1000, now - tonumber(ARGV[20]))
    if from < now then
      last = from
    end
  end
end

-- Clamp a backward clock jump (a failover to a server whose clock is
-- behind): no refill, no debit, and last never moves back.
if now < last then
  now = last
end
-- reshareTo is a share write (escrow.credit, then bucket.go's reshare):
-- credit what was given to us in generation gen (window rwin), cumulative
-- recv, and not credited yet, switch to share s, then release what is
-- above the new capacity, returned in thousandths.
local function reshareTo(s, gen, recv, rwin)
  local credit = 0
  if gen > 0 and rwin == win and (gen > sgen or (gen == sgen and rwin >= swin)) then
    if gen > sgen or rwin > swin then
      sgen, swin, scred = gen, rwin, 0
    end
    if recv > scred then
      credit = recv - scred
      scred = recv
    end
  end
  share = s
  rate, capacity = regional(share)
  tokens = tokens + credit / 1000
  local released = 0
  if tokens > capacity then
    released = math.floor((tokens - capacity) * 1000)
    tokens = capacity
  end
  return released
end

-- GrantRequest.Raise: each step's share as if a share write had landed
-- when it was set (not before the bucket's last update, which saw the
-- share in force); what a step releases is dropped.
local raised = false
for i = 1, steps do
  raised = true
  local at = now - tonumber(ARGV[19 + 2 * i])
  if at > last then
    tokens = tokens + (at - last) / 1e6 * rate
    last = at
  end
  if tokens > capacity then
    tokens = capacity
  end
  local s = tonumber(ARGV[18 + 2 * i])
  if i == steps and op == 'g' then
    reshareTo(s, tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]))
  else
    share = s
    rate, capacity = regional(share)
    if tokens > capacity then
      tokens = capacity
    end
  end
end

local wend = 0
if fixed then
  -- bucket.advance: no refill within a window; full again in a newer one.
  local start
  start, wend = windowAt(now)
  if not start then
    return redis.error_reply('ERR ration: the store clock ' .. string.format('%d', now) .. ' is outside the fixed window at ' .. KEYS[1])
  end
  if start > win then
    tokens, win = capacity, start
  end
else
  tokens = tokens + (now - last) / 1e6 * rate
end
if tokens > capacity then
  tokens = capacity
end
last = now

-- GrantRequest.MaxShare: brought forward at the old share (above), the
-- share is lowered to the cap as a share update without tokens would,
-- dropping what is above the new capacity.
local capped = false
local maxShare = tonumber(ARGV[18] or '0') or 0
if op == 'g' and maxShare > 0 and share > maxShare and not fixed then
  capped = true
  share = maxShare
  rate, capacity = regional(share)
  if tokens > capacity then
    tokens = capacity
  end
end

local granted = 0
if op == 'g' then
  local k = math.floor(tokens / cost)
  if k * cost > tokens then
    -- The quotient rounded up past the truth (see bucket.go's take).
    k = k - 1
  end
  local w = math.floor(n / cost)
  if k > w then
    k = w
  end
  granted = k * cost
  tokens = tokens - granted
elseif op == 'r' then
  tokens = tokens + n
  if tokens > capacity then
    tokens = capacity
  end
elseif op == 's' then
  -- Brought forward at the old share (above).
  granted = reshareTo(n, tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]))
end

-- expireAtMillis: a fixed window's bucket vanishes when the window ends
-- (missing, it is full); a token bucket once it is full again, 2 ×
-- capacity / rate after its last update. A bucket that never refills never
-- expires (0), or it would come back full.
bexp = 0
if fixed then
  bexp = math.ceil(wend / 1000)
elseif rate > 0 then
  local ttl = math.ceil(2 * capacity / rate * 1000)
  if ttl <= 1099511627776 then
    bexp = math.ceil(now / 1000) + ttl
  end
end

-- shareExpireAtMillis: a key with a share lives at least ShareTTL from the
-- latest share write, never less than its bucket, and never expires while
-- a bucket that never expires, or its state, says so. Layout "g" moves a
-- share of before issue 12 into the state with the expiry it had.
local keep = folded or op == 's' or capped or raised or (grouped and oldShare)
local keyexp = bexp
if not keep or bexp == 0 then
  -- the bucket's expiry, or never
elseif op == 's' or capped or raised then
  keyexp = math.max(bexp, math.ceil(now / 1000) + shareTTL)
else
  local cur = sexp
  if folded then
    cur = curexp or pexpiretime(keyName)
  end
  if cur == 0 then
    keyexp = 0
  elseif cur > keyexp then
    keyexp = cur
  end
end
write(keep, keyexp)
if (op == 's' or capped or raised) and oldShare and not grouped then
  redis.call('DEL', KEYS[4])
end

if fixed then
  return {granted, string.format('%.17g', tokens), share, wend - now, win}
end
return {granted, string.format('%.17g', tokens), share, 0, 0}
