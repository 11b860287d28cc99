package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/adminapi"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// The operating commands (inspect, top, status) ask regiond's admin API
// (internal/adminapi) of every region named by -admin, at once, and print
// what each answered; a region that fails is reported beside the others,
// never in their stead.

// Defaults of the admin flags, and the environment variables that replace
// them.
const (
	defaultAdmin    = "127.0.0.1:7071"
	defaultAdminTTL = 5 * time.Second // -timeout of the operating commands
	envAdmin        = "RATION_ADMIN"
	envAdminToken   = "RATION_ADMIN_TOKEN_FILE"
	envAdminCA      = "RATION_ADMIN_CA"
	// maxAnswer bounds the body read from a region: the largest answer
	// (a top of a thousand keys) is far below it, and a misdirected
	// -admin (a web server, a proxy's error page) is refused rather than
	// read whole.
	maxAnswer = 4 << 20
	// maxTargets bounds -admin: one goroutine and connection each.
	maxTargets = 64
)

// adminFlags are the flags of the operating commands.
type adminFlags struct {
	admin                 string
	tokenFile             string
	ca, cert, key, server string
}

func defaultAdminFlags() adminFlags {
	a := adminFlags{admin: defaultAdmin, tokenFile: os.Getenv(envAdminToken), ca: os.Getenv(envAdminCA)}
	if v := os.Getenv(envAdmin); v != "" {
		a.admin = v
	}
	return a
}

// register adds the flags to fs, with a's values as their defaults (as
// globals.register).
func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.admin, "admin", a.admin, "regiond admin address(es), host:port or http(s) URL, comma-separated, one per region (env "+envAdmin+")")
	fs.StringVar(&a.tokenFile, "admin-token-file", a.tokenFile, "file holding the admin bearer token (regiond's -admin-token-file) (env "+envAdminToken+")")
	fs.StringVar(&a.ca, "admin-ca", a.ca, "CA bundle (PEM) that verifies https admin addresses; a host:port is then https (env "+envAdminCA+")")
	fs.StringVar(&a.cert, "admin-cert", a.cert, "client certificate (PEM) for admin listeners that verify clients")
	fs.StringVar(&a.key, "admin-key", a.key, "key (PEM) of -admin-cert")
	fs.StringVar(&a.server, "admin-server-name", a.server, "name the admin listeners' certificates carry (default: the host dialled)")
}

// adminOnly are the flags only the operating commands take; natsOnly
// those only the policy commands take.
var (
	adminOnly = []string{"admin", "admin-token-file", "admin-ca", "admin-cert", "admin-key", "admin-server-name"}
	natsOnly  = []string{"nats", "bucket", "nats-ca", "nats-cert", "nats-key", "nats-creds", "nats-nkey"}
)

// target is one admin address: as given (errors are keyed by it) and as
// the URL requests are made under.
type target struct {
	addr string
	base *url.URL
}

// parseTargets parses -admin. A host:port is http, or https when TLS files
// are given.
func parseTargets(list string, tls bool) ([]target, error) {
	var out []target
	seen := map[string]bool{}
	for addr := range strings.SplitSeq(list, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			return nil, usageErrorf("-admin %q: an empty address", list)
		}
		if seen[addr] {
			return nil, usageErrorf("-admin: %s is given twice", addr)
		}
		seen[addr] = true
		u, err := parseTarget(addr, tls)
		if err != nil {
			return nil, err
		}
		out = append(out, target{addr: addr, base: u})
	}
	if len(out) > maxTargets {
		return nil, usageErrorf("-admin: %d addresses, at most %d", len(out), maxTargets)
	}
	return out, nil
}

func parseTarget(addr string, tls bool) (*url.URL, error) {
	if !strings.Contains(addr, "://") {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, usageErrorf("-admin %s: want host:port or an http(s) URL (%v)", addr, err)
		}
		scheme := "http"
		if tls {
			scheme = "https"
		}
		return &url.URL{Scheme: scheme, Host: addr}, nil
	}
	u, err := url.Parse(addr)
	switch {
	case err != nil:
		return nil, usageErrorf("-admin %s: %v", addr, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, usageErrorf("-admin %s: the scheme must be http or https", addr)
	case u.Host == "":
		return nil, usageErrorf("-admin %s: no host", addr)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, usageErrorf("-admin %s: want a base URL, without user, query or fragment", addr)
	}
	// A path is a prefix (a proxy in front of regiond): the API's paths go
	// under it.
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = strings.TrimSuffix(u.RawPath, "/")
	return u, nil
}

// adminClient asks every target.
type adminClient struct {
	targets []target
	token   string
	tr      *http.Transport
	hc      *http.Client
}

// adminClient builds the client of the operating commands from the flags.
// Unusable flags or files are usage errors.
func (c *cli) adminClient() (*adminClient, error) {
	a := c.admin
	files := tlsfiles.Files{CA: a.ca, Cert: a.cert, Key: a.key, ServerName: a.server}
	targets, err := parseTargets(a.admin, files.Set())
	if err != nil {
		return nil, err
	}
	ac := &adminClient{targets: targets}
	if a.tokenFile != "" {
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return nil, usageErrorf("-admin-token-file: %v", err)
		}
		ac.token = strings.TrimSpace(string(b))
		if ac.token == "" || strings.ContainsAny(ac.token, "\r\n") {
			return nil, usageErrorf("-admin-token-file %s: want one line holding the token", a.tokenFile)
		}
	}
	ac.tr = &http.Transport{
		DialContext:           (&net.Dialer{Timeout: c.g.timeout}).DialContext,
		TLSHandshakeTimeout:   c.g.timeout,
		ResponseHeaderTimeout: c.g.timeout,
		MaxIdleConnsPerHost:   1,
	}
	if files.Set() {
		ct, err := tlsfiles.Client(files)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		ac.tr.DialTLSContext = ct.Dial
	}
	// No proxy from the environment: admin listeners are internal, and a
	// proxy would see the token. Redirects are not followed: the token would go wherever they point.
	ac.hc = &http.Client{Transport: ac.tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	c.closers = append(c.closers, ac.tr.CloseIdleConnections)
	return ac, nil
}

// regionError is what went wrong with one target.
type regionError struct {
	addr string
	// code is the exit status it calls for: exitRefused when the region
	// answered that it has no such thing (a 400 or 404), exitUnreachable
	// otherwise.
	code int
	err  error
}

func (e *regionError) Error() string { return e.addr + ": " + e.err.Error() }
func (e *regionError) Unwrap() error { return e.err }

// errNotJSON is wrapped by the error of an answer that is not the admin
// API's JSON.
var errNotJSON = errors.New("the answer is not the admin API's JSON")

// answer is one target's answer: v, or err.
type answer[T any] struct {
	t   target
	v   T
	err *regionError
}

// fetch asks every target for path?query at once and returns their
// answers in the order of the targets. check refuses a decoded answer
// that is not what path serves.
func fetch[T any](ctx context.Context, ac *adminClient, path string, query url.Values, check func(*T) error) []answer[T] {
	out := make([]answer[T], len(ac.targets))
	var wg sync.WaitGroup
	for i, t := range ac.targets {
		out[i].t = t
		wg.Go(func() {
			err := ac.get(ctx, t, path, query, &out[i].v)
			if err == nil && check != nil {
				err = check(&out[i].v)
			}
			if err != nil {
				var re *regionError
				if !errors.As(err, &re) {
					re = &regionError{addr: t.addr, code: exitUnreachable, err: err}
				}
				out[i].err = re
			}
		})
	}
	wg.Wait()
	return out
}

// get makes one request and decodes its JSON into v.
func (ac *adminClient) get(ctx context.Context, t target, path string, query url.Values, v any) error {
	u := *t.base
	// path is escaped already (a store key is one segment, its slashes
	// %2F): set both forms so that it is sent as given.
	unescaped, err := url.PathUnescape(path)
	if err != nil {
		return err
	}
	u.Path += unescaped
	u.RawPath = t.base.EscapedPath() + path
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if ac.token != "" {
		req.Header.Set("Authorization", "Bearer "+ac.token)
	}
	resp, err := ac.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is the address, said already
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within -timeout: %w", err)
		}
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if len(body) > maxAnswer {
		return fmt.Errorf("%w: larger than %d bytes (4 MiB); is -admin regiond's admin listener?", errNotJSON, maxAnswer)
	}
	if resp.StatusCode != http.StatusOK {
		return statusError(t, resp, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w (Content-Type %q, %s): %w", errNotJSON, resp.Header.Get("Content-Type"), snippet(body), err)
	}
	return nil
}

// statusError is the error of an answer other than 200: the admin API's
// Error when the body is one.
func statusError(t target, resp *http.Response, body []byte) error {
	msg := snippet(body)
	var e adminapi.Error
	api := json.Unmarshal(body, &e) == nil && e.Error != ""
	if api {
		msg = e.Error
	}
	re := &regionError{addr: t.addr, code: exitUnreachable}
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusNotFound:
		if api {
			re.code = exitRefused // the region has no such key or rule
		} else {
			msg += " (not regiond's admin API: a regiond without it, or another server)"
		}
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += " (the admin token: -admin-token-file)"
	case http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		msg = "redirected to " + resp.Header.Get("Location") + " (not followed: give that address to -admin)"
	}
	re.err = fmt.Errorf("%s: %s", resp.Status, msg)
	return re
}

// snippet is the start of a body, printable, for an error message.
func snippet(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return "empty body"
	}
	const max = 80
	s := string(body)
	if len(s) > max {
		s = s[:max]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return fmt.Sprintf("%q", s)
}

// regionOf checks that an answer names its region, as every admin API
// answer does.
func regionOf(region string) error {
	if region == "" {
		return fmt.Errorf("%w: it names no region", errNotJSON)
	}
	return nil
}

// exitError ends a command with a status, its output printed already.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// errorsOf collects the failed targets' errors (keyed by address) and the
// exit status they call for: exitUnreachable over exitRefused.
func errorsOf[T any](as []answer[T]) (map[string]string, int) {
	errs := map[string]string{}
	code := exitOK
	for _, a := range as {
		if a.err == nil {
			continue
		}
		errs[a.t.addr] = a.err.err.Error()
		code = max(code, a.err.code)
	}
	return errs, code
}

// reportErrors prints the failed targets' errors on stderr (text output).
func (c *cli) reportErrors(addrs []string, errs map[string]string) {
	for _, a := range addrs {
		if msg, ok := errs[a]; ok {
			fmt.Fprintf(c.stderr, "ration: %s: %s\n", a, msg)
		}
	}
}

func addrsOf[T any](as []answer[T]) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.t.addr
	}
	return out
}

// finish ends an operating command: exit status code, the output printed.
func finish(code int) error {
	if code == exitOK {
		return nil
	}
	return exitError{code}
}
