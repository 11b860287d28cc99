-- The regional allocator contract (DESIGN.md, "Level 1") for one key.
-- bucket.go holds the same arithmetic in Go for MemoryStore: keep the two
-- in step, expression for expression, so both stores round alike.
--
-- KEYS[1]  the bucket: a hash {tokens = %.17g float, last = µs integer,
--          w = a fixed window's start in µs (fixed windows only)}
-- KEYS[2]  the key's applied share in ppm, then, once the exchange has
--          moved tokens, ":" generation ":" window ":" tokens credited in
--          that era (thousandths); no TTL (exchange state).
--          Both carry the same hash tag, so they share a Cluster slot.
-- ARGV[1]  op: "g" grant, "r" return, "s" set share
-- ARGV[2]  L, the key's global rate (tokens/s)
-- ARGV[3]  b, the key's global burst (tokens)
-- ARGV[4]  cost (tokens)
-- ARGV[5]  initial share in ppm, used while KEYS[2] is missing
-- ARGV[6]  "1" when a missing bucket starts empty, else "0"
-- ARGV[7]  g: tokens wanted; r: tokens returned; s: the new share in ppm
-- ARGV[8]  s: the exchange generation of ARGV[9] (0: no tokens)
-- ARGV[9]  s: tokens received in that generation, cumulative, thousandths
-- ARGV[10] s: the fixed window (start, µs) of ARGV[9]; 0 for a bucket
-- ARGV[11..14] a fixed window's boundaries in µs (previous start, start,
--          end, next end); all 0 for a token bucket
--
-- Returns {granted (s: tokens released, thousandths), tokens left as a
-- %.17g string, share in ppm in force, µs to a fixed window's end (0 for a
-- bucket), the fixed window's start (0 for a bucket)}.
-- Arguments are validated by the Go caller before they are sent.
--
-- Time is the server's own (TIME), never the caller's. Redis >= 5 replicates
-- a script's effects rather than the script, so reading TIME is allowed and
-- replicas apply the same values; older servers need replicate_commands.
if redis.replicate_commands then
  redis.replicate_commands()
end

local op = ARGV[1]
local L = tonumber(ARGV[2])
local B = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local n = tonumber(ARGV[7])
local w0, w1, w2, w3 = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local fixed = w1 > 0

-- Limit.Regional: rate = L × share, capacity = max(b × share, cost).
local function regional(share)
  local s = share / 1000000
  local rate = L * s
  local capacity = B * s
  if capacity < cost then
    capacity = cost
  end
  return rate, capacity
end

-- Limit.windowAt: the fixed window containing t, or nil.
local function windowAt(t)
  if t >= w1 and t < w2 then
    return w1, w2
  elseif t >= w2 and t < w3 then
    return w2, w3
  elseif t >= w0 and t < w1 then
    return w0, w1
  end
  return nil, nil
end

local stored = redis.call('GET', KEYS[2])
local share, sgen, swin, scred = tonumber(ARGV[5]), 0, 0, 0
if stored then
  local s, g, w, c = string.match(stored, '^(%d+):(%d+):(%d+):(%d+)$')
  if s then
    share, sgen, swin, scred = tonumber(s), tonumber(g), tonumber(w), tonumber(c)
  else
    share = tonumber(stored)
  end
end
if not share or share < 0 or share > 1000000 or share ~= math.floor(share) then
  -- Written by something other than this script: refuse rather than
  -- grant at a rate the exchange never agreed to.
  return redis.error_reply('ERR ration: bad share ' .. tostring(stored) .. ' at ' .. KEYS[2])
end
local rate, capacity = regional(share)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local state = redis.call('HMGET', KEYS[1], 'tokens', 'last', 'w')
local tokens, last, win
if state[1] and state[2] then
  tokens = tonumber(state[1])
  last = tonumber(state[2])
  win = tonumber(state[3] or '0')
else
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
end

-- Clamp a backward clock jump (a failover to a server whose clock is
-- behind): no refill, no debit, and last never moves back.
if now < last then
  now = last
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
  -- Brought forward at the old share (above): credit what was given to us
  -- and not credited yet (escrow.credit), switch, then release what is
  -- above the new capacity (bucket.go's reshare).
  local gen, recv, rwin, credit = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), 0
  if gen > 0 and rwin == win and (gen > sgen or (gen == sgen and rwin >= swin)) then
    if gen > sgen or rwin > swin then
      sgen, swin, scred = gen, rwin, 0
    end
    if recv > scred then
      credit = recv - scred
      scred = recv
    end
  end
  if sgen > 0 then
    redis.call('SET', KEYS[2], string.format('%d:%d:%d:%d', n, sgen, swin, scred))
  else
    redis.call('SET', KEYS[2], ARGV[7])
  end
  share = n
  rate, capacity = regional(share)
  tokens = tokens + credit / 1000
  if tokens > capacity then
    granted = math.floor((tokens - capacity) * 1000)
    tokens = capacity
  end
end

if fixed then
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'last', string.format('%d', now), 'w', string.format('%d', win))
  -- A window's bucket vanishes when the window ends: missing, it is full.
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', math.ceil(wend / 1000)))
  return {granted, string.format('%.17g', tokens), share, wend - now, win}
end

redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'last', string.format('%d', now))

-- An idle bucket vanishes once it is full again: 2 × capacity / rate
-- after its last update. A bucket that never refills never expires, or it
-- would come back full.
local ttl = -1
if rate > 0 then
  ttl = math.ceil(2 * capacity / rate * 1000)
end
if ttl > 0 and ttl <= 1099511627776 then
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', math.ceil(now / 1000) + ttl))
else
  redis.call('PERSIST', KEYS[1])
end

return {granted, string.format('%.17g', tokens), share, 0, 0}
