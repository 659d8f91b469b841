package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
)

// Environment of the operator's commands for a node with http.tokens_file
// and http.tls: the token is not a flag, so it does not show in ps.
const (
	opsTokenEnv  = "PEAT_TOKEN"
	opsCAFileEnv = "PEAT_CAFILE"
)

// authorize adds the bearer token to req and returns the client to send
// it with: one that trusts PEAT_CAFILE when it is set.
func (o opsOptions) authorize(req *http.Request) (*http.Client, error) {
	if o.token != "" {
		req.Header.Set("Authorization", "Bearer "+o.token)
	}
	if o.cafile == "" {
		return http.DefaultClient, nil
	}
	pem, err := os.ReadFile(o.cafile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opsCAFileEnv, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", opsCAFileEnv, o.cafile)
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}, nil
}
