// Package natsauth turns the NATS flags that regiond and the ration CLI
// share (a CA, a client certificate, a .creds file or an nkey seed) into
// nats.go options, so that both connect alike.
package natsauth

import (
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Files are the PEM and credential files of a NATS connection; any may be
// empty. Creds and Nkey are exclusive (the caller validates).
type Files struct {
	// CA verifies the servers (read at start); Cert and Key are a client
	// certificate (read again when they change).
	CA, Cert, Key string
	// Creds is a .creds file (a user JWT and its nkey seed); Nkey a file
	// holding an nkey user's seed.
	Creds, Nkey string
	// Logger receives the certificate reloads' problems.
	Logger *slog.Logger
}

// Options returns the options that connect with f: TLS when a CA or a
// certificate is given, and the credentials.
func Options(f Files) ([]nats.Option, error) {
	var opts []nats.Option
	if f.CA != "" || f.Cert != "" {
		ct, err := tlsfiles.Client(tlsfiles.Files{CA: f.CA, Cert: f.Cert, Key: f.Key, Logger: f.Logger})
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(ct.Static()))
	}
	switch {
	case f.Creds != "":
		opts = append(opts, nats.UserCredentials(f.Creds))
	case f.Nkey != "":
		o, err := nats.NkeyOptionFromSeed(f.Nkey)
		if err != nil {
			return nil, fmt.Errorf("nkey seed %s: %w", f.Nkey, err)
		}
		opts = append(opts, o)
	}
	return opts, nil
}
