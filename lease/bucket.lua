-- The regional allocator contract (DESIGN.md, "Level 1") for one key.
-- bucket.go holds the same arithmetic in Go for MemoryStore: keep the two
-- in step, expression for expression, so both stores round alike.
--
-- KEYS[1]  the bucket: a hash {tokens = %.17g float, last = µs integer}
-- KEYS[2]  the key's applied share in ppm, then, once the exchange has
--          moved tokens, ":" its generation ":" the tokens credited in it
--          (thousandths); no TTL (exchange state).
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
--
-- Returns {granted (s: tokens released, thousandths), tokens left as a
-- %.17g string, share in ppm in force}.
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

local stored = redis.call('GET', KEYS[2])
local share, sgen, scred = tonumber(ARGV[5]), 0, 0
if stored then
  local s, g, c = string.match(stored, '^(%d+):(%d+):(%d+)$')
  if s then
    share, sgen, scred = tonumber(s), tonumber(g), tonumber(c)
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

local state = redis.call('HMGET', KEYS[1], 'tokens', 'last')
local tokens, last
if state[1] and state[2] then
  tokens = tonumber(state[1])
  last = tonumber(state[2])
else
  -- No bucket: start the one it stands for (a share change too, so that
  -- the tokens it held at the old share are counted, not its new capacity).
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
tokens = tokens + (now - last) / 1e6 * rate
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
  -- Refilled at the old rate up to now (above): credit what was given to
  -- us and not credited yet (escrowCredit), switch, then release what is
  -- above the new capacity (bucket.go's reshare).
  local gen, recv, credit = tonumber(ARGV[8]), tonumber(ARGV[9]), 0
  if gen > 0 and gen >= sgen then
    if gen > sgen then
      sgen, scred = gen, 0
    end
    if recv > scred then
      credit = recv - scred
      scred = recv
    end
  end
  if sgen > 0 then
    redis.call('SET', KEYS[2], string.format('%d:%d:%d', n, sgen, scred))
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

redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'last', string.format('%d', now))

-- An idle bucket vanishes once it would be full again: 2 × capacity / rate
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

return {granted, string.format('%.17g', tokens), share}
