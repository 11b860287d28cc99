package agent

import (
	"context"
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func BenchmarkAdhocFixedClock(b *testing.B) {
	r := startRegion(b, benchPolicy, nil)
	t0 := time.Now()
	a := newAgent(b, r, Config{Clock: func() time.Time { return t0 }})
	d := ds("tenant", "acme")
	ctx := context.Background()
	a.Allow(ctx, d, 1)
	k := a.keys.get([]byte("bench\x00tenant=acme"))
	k.mu.Lock()
	k.slots.install(a.now(), a.now()+int64(time.Hour), 1<<46)
	k.lowWater.Store(0)
	k.mu.Unlock()
	b.Run("ration", func(b *testing.B) {
		for b.Loop() {
			a.Allow(ctx, d, 1)
		}
	})
	b.Run("xrate", func(b *testing.B) {
		lim := rate.NewLimiter(1e15, math.MaxInt32)
		for b.Loop() {
			lim.AllowN(t0, 1)
		}
	})
	b.Run("ration-par", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				a.Allow(ctx, d, 1)
			}
		})
	})
	b.Run("xrate-par", func(b *testing.B) {
		lim := rate.NewLimiter(1e15, math.MaxInt32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.AllowN(t0, 1)
			}
		})
	})
}

func BenchmarkAdhocParts(b *testing.B) {
	r := startRegion(b, benchPolicy, nil)
	t0 := time.Now()
	a := newAgent(b, r, Config{Clock: func() time.Time { return t0 }})
	d := ds("tenant", "acme")
	ctx := context.Background()
	a.Allow(ctx, d, 1)
	k := a.keys.get([]byte("bench\x00tenant=acme"))
	k.mu.Lock()
	k.slots.install(a.now(), a.now()+int64(time.Hour), 1<<43)
	k.lowWater.Store(0)
	k.mu.Unlock()
	b.Run("pool", func(b *testing.B) {
		for b.Loop() {
			s := a.scratch.Get().(*scratch)
			a.scratch.Put(s)
		}
	})
	b.Run("spend", func(b *testing.B) {
		for b.Loop() {
			k.slots.spend(1, 1)
		}
	})
	b.Run("now", func(b *testing.B) {
		for b.Loop() {
			a.now()
		}
	})
	s := a.scratch.Get().(*scratch)
	b.Run("decide", func(b *testing.B) {
		for b.Loop() {
			a.decide(ctx, s, 1, d, 1)
		}
	})
	b.Run("record", func(b *testing.B) {
		dd := Decision{Allowed: true, Path: PathLease}
		for b.Loop() {
			a.record(s, 1, dd)
		}
	})
	b.Run("finish", func(b *testing.B) {
		for b.Loop() {
			a.finish(s, 1)
		}
	})
}

var sink uint64

func BenchmarkAdhocCores(b *testing.B) {
	work := func() uint64 {
		x := uint64(1)
		for i := 0; i < 100; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		return x
	}
	b.Run("single", func(b *testing.B) {
		for b.Loop() {
			sink += work()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			var s uint64
			for pb.Next() {
				s += work()
			}
			_ = s
		})
	})
}
