package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ration-dev/ration/internal/redistest"
)

// TestDeleteShares checks that deleting an applied share puts the bucket
// back on its initial share, on both stores.
func TestDeleteShares(t *testing.T) {
	client, err := NewRedisClient(redistest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	rs, err := NewRedisStore(client, RedisConfig{Prefix: redistest.KeyPrefix(t), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type store interface {
		SetShares(ctx context.Context, ups []ShareUpdate, out []ShareResult) error
		Shares(ctx context.Context, keys []string, out []int64) error
		DeleteShares(ctx context.Context, keys []string) error
	}
	for name, s := range map[string]store{"memory": NewMemoryStore(MemoryConfig{}), "redis": rs} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := Limit{Rate: 100, Burst: 100, Cost: 1, InitialShare: 300_000}
			if err := s.SetShares(ctx, []ShareUpdate{{Key: "r/a", SharePPM: 500_000, Limit: l}, {Key: "r/b", SharePPM: 200_000, Limit: l}}, nil); err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteShares(ctx, []string{"r/a", "r/never"}); err != nil {
				t.Fatal(err)
			}
			got := make([]int64, 3)
			if err := s.Shares(ctx, []string{"r/a", "r/b", "r/never"}, got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]int64{-1, 200_000, -1}, got); diff != "" {
				t.Errorf("shares after delete (-want +got):\n%s", diff)
			}
			if err := s.DeleteShares(ctx, []string{""}); !errors.Is(err, ErrInvalid) {
				t.Errorf("empty key: got %v, want ErrInvalid", err)
			}
		})
	}
}
