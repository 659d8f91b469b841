package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"github.com/eclipse/paho.golang/paho"
)

// replayPasswordEnv holds the password of --user: an environment variable,
// not a flag, so it does not show in ps.
const replayPasswordEnv = "PEAT_PASSWORD"

// dialBroker connects to the broker, over TLS when --cafile is given (with
// the client certificate of --cert and --key when given).
func (o replayOptions) dialBroker(ctx context.Context) (net.Conn, error) {
	if o.cafile == "" {
		return (&net.Dialer{}).DialContext(ctx, "tcp", o.broker)
	}
	pem, err := os.ReadFile(o.cafile)
	if err != nil {
		return nil, fmt.Errorf("--cafile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--cafile %s holds no PEM certificate", o.cafile)
	}
	host, _, err := net.SplitHostPort(o.broker)
	if err != nil {
		return nil, fmt.Errorf("--broker: %w", err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}
	if o.cert != "" || o.key != "" {
		pair, err := tls.LoadX509KeyPair(o.cert, o.key)
		if err != nil {
			return nil, fmt.Errorf("--cert, --key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", o.broker)
}

// credentials puts --user and $PEAT_PASSWORD into the CONNECT.
func (o replayOptions) credentials(c *paho.Connect, lookupEnv func(string) (string, bool)) {
	if o.user == "" {
		return
	}
	c.UsernameFlag, c.Username = true, o.user
	if pw, ok := lookupEnv(replayPasswordEnv); ok {
		c.PasswordFlag, c.Password = true, []byte(pw)
	}
}
