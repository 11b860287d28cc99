package kvstore_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/ration-dev/ration/policy/kvstore"
	"github.com/ration-dev/ration/sync/embedded"
)

// Push two revisions, roll the second back, and read what a region's
// Watcher would enforce.
func Example() {
	ctx := context.Background()
	srv, err := embedded.Start(embedded.Config{JetStream: true})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := kvstore.Open(ctx, kvstore.Config{Conn: nc, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	v1 := []byte("rules:\n  - {name: per-tenant, key: [tenant], limit: 100}\n")
	v2 := []byte("rules:\n  - {name: per-tenant, key: [tenant], limit: 200}\n")
	r1, err := st.Push(ctx, v1, kvstore.Meta{Author: "alice", Message: "first"})
	if err != nil {
		log.Fatal(err)
	}
	r2, err := st.Push(ctx, v2, kvstore.Meta{Author: "alice", Message: "double"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(r2.Diff)
	if _, err := st.Rollback(ctx, r1.Revision, kvstore.Meta{Author: "bob", Message: "too much"}); err != nil {
		log.Fatal(err)
	}

	w, err := kvstore.NewWatcher(ctx, st, kvstore.WatcherConfig{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	s := w.State()
	fmt.Printf("revision %d (%s of %d by %s): limit %d\n", s.EnforcedRev.Revision, s.EnforcedRev.Op,
		s.EnforcedRev.FromRevision, s.EnforcedRev.Author, s.Enforced.Rule("per-tenant").Limit)
	// Output:
	// @@ -1,2 +1,2 @@
	//  rules:
	// -  - {name: per-tenant, key: [tenant], limit: 100}
	// +  - {name: per-tenant, key: [tenant], limit: 200}
	// revision 3 (rollback of 1 by bob): limit 100
}
