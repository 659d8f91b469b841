package edge

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"

	"github.com/peatmq/peat/edge/auth"
	"github.com/peatmq/peat/mqtt"
)

// AuthConfig is who may connect and what they may do (edge/auth).
type AuthConfig struct {
	// UsersFile holds "name:hash" lines (`peat passwd`, or Mosquitto's
	// mosquitto_passwd); empty: user names are not checked.
	UsersFile string `yaml:"users_file"`
	// ACLFile holds the topic rules; empty: a client let in may do
	// everything.
	ACLFile string `yaml:"acl_file"`
	// AllowAnonymous lets in clients without a user name (and, without a
	// users file, with any). Needed to serve the network without users.
	AllowAnonymous bool `yaml:"allow_anonymous"`
	// MaxConcurrentHashes bounds the password hashes computed at once;
	// 0 is one less than the CPUs, at least 1.
	MaxConcurrentHashes int `yaml:"max_concurrent_hashes"`
}

// TLSConfig is a listener's TLS.
type TLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile holds the CAs that sign client certificates.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientAuth is none, request (verify a certificate if one is given)
	// or require.
	ClientAuth string `yaml:"client_auth"`
	// CertIdentity makes a client certificate's CN (else its first SAN)
	// the client's user name, with no password.
	CertIdentity bool `yaml:"cert_identity"`
}

// enabled reports whether the listener serves TLS.
func (t TLSConfig) enabled() bool { return t.CertFile != "" }

// hasAuth reports whether clients are authenticated: by password, or by a
// certificate every client must present.
func (c Config) hasAuth() bool {
	return c.Auth.UsersFile != "" || (c.MQTT.TLS.CertIdentity && c.MQTT.TLS.ClientAuth == "require")
}

// validateSecurity adds the problems of the auth and TLS fields, and
// refuses a listener reachable from the network that would let anyone in
// or carry passwords in the clear, unless the config says so explicitly.
func (c Config) validateSecurity(add func(path, format string, args ...any)) {
	c.validateHTTPSecurity(add)
	if c.Auth.MaxConcurrentHashes < 0 {
		add("auth.max_concurrent_hashes", "must be 0 (automatic) or positive, got %d", c.Auth.MaxConcurrentHashes)
	}
	t := c.MQTT.TLS
	switch t.ClientAuth {
	case "", "none", "request", "require":
	default:
		add("mqtt.tls.client_auth", "must be none, request or require, got %q", t.ClientAuth)
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		add("mqtt.tls", "cert_file and key_file go together")
	}
	if t.ClientCAFile != "" && !t.enabled() {
		add("mqtt.tls.client_ca_file", "needs mqtt.tls.cert_file and key_file (TLS)")
	}
	if (t.ClientAuth == "request" || t.ClientAuth == "require") && t.ClientCAFile == "" {
		add("mqtt.tls.client_auth", "%s needs mqtt.tls.client_ca_file to verify client certificates", t.ClientAuth)
	}
	if t.CertIdentity && (t.ClientAuth == "" || t.ClientAuth == "none") {
		add("mqtt.tls.cert_identity", "needs mqtt.tls.client_auth request or require")
	}
	if c.Auth.ACLFile != "" && !c.hasAuth() && !c.Auth.AllowAnonymous {
		add("auth.acl_file", "without auth.users_file every client is anonymous, and anonymous clients are refused: "+
			"set auth.users_file, or auth.allow_anonymous: true to apply the ACL to anonymous clients")
	}
	if c.MQTT.Listen == "" || checkHostPort(c.MQTT.Listen) != "" || loopback(c.MQTT.Listen) {
		return
	}
	if !c.hasAuth() && !c.Auth.AllowAnonymous {
		add("mqtt.listen", "%q is reachable from the network and nobody is authenticated: set auth.users_file "+
			"(write it with `peat passwd`), or set auth.allow_anonymous: true to let any client in", c.MQTT.Listen)
	}
	if !t.enabled() && !c.MQTT.AllowPlaintext {
		add("mqtt.listen", "%q is reachable from the network without TLS: set mqtt.tls.cert_file and "+
			"mqtt.tls.key_file, or set mqtt.allow_plaintext: true to send passwords and messages in the clear", c.MQTT.Listen)
	}
}

// loopback reports whether addr (host:port) binds only the loopback
// interface. An empty host, a wildcard address or a name other than
// localhost counts as reachable from the network.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newAuth reads the users and ACL files, when any auth is configured: nil
// when the broker lets everyone do everything (no users file, no ACL, no
// certificate identity). A file that cannot be read or holds a bad line
// fails the start, naming the field.
func (c Config) newAuth() (*auth.Auth, error) {
	if c.Auth.UsersFile == "" && c.Auth.ACLFile == "" && !c.MQTT.TLS.CertIdentity {
		return nil, nil
	}
	a, err := auth.New(auth.Config{
		UsersFile:           c.Auth.UsersFile,
		ACLFile:             c.Auth.ACLFile,
		AllowAnonymous:      c.Auth.AllowAnonymous,
		CertIdentity:        c.MQTT.TLS.CertIdentity,
		MaxConcurrentHashes: c.Auth.MaxConcurrentHashes,
	})
	if err != nil {
		return nil, fmt.Errorf("auth (auth.users_file, auth.acl_file): %w", err)
	}
	return a, nil
}

// mqttAuth adapts edge/auth to the broker's Auth interface.
type mqttAuth struct{ a *auth.Auth }

var _ mqtt.Auth = mqttAuth{}

func (m mqttAuth) Authenticate(l mqtt.Login) (mqtt.Access, string, bool) {
	acc, why, ok := m.a.Authenticate(l.ClientID, l.Username, l.Password, l.CertNames)
	if !ok {
		return nil, why, false
	}
	return acc, "", true
}

// mqttTLS builds the MQTT listener's TLS configuration, nil without TLS.
func (c Config) mqttTLS() (*tls.Config, *keyPair, error) {
	t := c.MQTT.TLS
	if !t.enabled() {
		return nil, nil, nil
	}
	cfg, kp, err := serverTLS(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("mqtt.tls: %w", err)
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("mqtt.tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("mqtt.tls.client_ca_file: %s holds no PEM certificate", t.ClientCAFile)
		}
		cfg.ClientCAs = pool
	}
	switch strings.ToLower(t.ClientAuth) {
	case "request":
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	case "require":
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, kp, nil
}

// serverTLS is a server TLS configuration with the key pair of certFile
// and keyFile, TLS 1.2 at least. Its certificate is read again by
// keyPair.reload (SIGHUP), so a renewed certificate needs no restart.
func serverTLS(certFile, keyFile string) (*tls.Config, *keyPair, error) {
	kp := &keyPair{certFile: certFile, keyFile: keyFile}
	if err := kp.reload(); err != nil {
		return nil, nil, err
	}
	return &tls.Config{GetCertificate: kp.get, MinVersion: tls.VersionTLS12}, kp, nil
}

// keyPair is a listener's certificate and key, replaced as a whole when
// both files read well.
type keyPair struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func (k *keyPair) reload() error {
	pair, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("load key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	k.cur.Store(&pair)
	return nil
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return k.cur.Load(), nil }
