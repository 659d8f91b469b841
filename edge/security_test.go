package edge

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/auth"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// Each fail-safe default, by the field the error names and what it tells
// the user to set.
func TestConfig_NetworkListenerFailsSafe(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		want   []string // substrings of the error; none: valid
	}{
		{"loopback without auth", func(c *Config) {}, nil},
		{"localhost without auth", func(c *Config) { c.MQTT.Listen = "localhost:1883" }, nil},
		{"IPv6 loopback", func(c *Config) { c.MQTT.Listen = "[::1]:1883" }, nil},
		{"network without auth or TLS", func(c *Config) { c.MQTT.Listen = "0.0.0.0:1883" },
			[]string{"mqtt.listen", "auth.users_file", "auth.allow_anonymous: true", "mqtt.tls.cert_file", "mqtt.allow_plaintext: true"}},
		{"empty host is every interface", func(c *Config) { c.MQTT.Listen = ":1883" }, []string{"mqtt.listen", "reachable from the network"}},
		{"network with users, no TLS", func(c *Config) {
			c.MQTT.Listen, c.Auth.UsersFile = "0.0.0.0:1883", "users"
		}, []string{"mqtt.allow_plaintext"}},
		{"network with TLS, nobody authenticated", func(c *Config) {
			c.MQTT.Listen, c.MQTT.TLS.CertFile, c.MQTT.TLS.KeyFile = "0.0.0.0:8883", "c", "k"
		}, []string{"auth.allow_anonymous"}},
		{"network, both opted out", func(c *Config) {
			c.MQTT.Listen, c.Auth.AllowAnonymous, c.MQTT.AllowPlaintext = "0.0.0.0:1883", true, true
		}, nil},
		{"network, users and TLS", func(c *Config) {
			c.MQTT.Listen, c.Auth.UsersFile, c.MQTT.TLS.CertFile, c.MQTT.TLS.KeyFile = "0.0.0.0:8883", "u", "c", "k"
		}, nil},
		{"network, certificates required as identity", func(c *Config) {
			c.MQTT.Listen, c.MQTT.TLS = "0.0.0.0:8883", TLSConfig{CertFile: "c", KeyFile: "k", ClientCAFile: "ca",
				ClientAuth: "require", CertIdentity: true}
		}, nil},
		{"HTTP on the network without tokens or TLS", func(c *Config) { c.HTTP.Listen = "0.0.0.0:8080" },
			[]string{"http.listen", "http.tokens_file", "auth.allow_anonymous", "http.tls.cert_file", "http.allow_plaintext: true"}},
		{"HTTP on the network with tokens and TLS", func(c *Config) {
			c.HTTP.Listen, c.HTTP.TokensFile, c.HTTP.TLS = "0.0.0.0:8443", "t", HTTPTLSConfig{CertFile: "c", KeyFile: "k"}
		}, nil},
		{"ACL without users", func(c *Config) { c.Auth.ACLFile = "acl" }, []string{"auth.acl_file", "auth.allow_anonymous"}},
		{"key without cert", func(c *Config) { c.MQTT.TLS.KeyFile = "k" }, []string{"mqtt.tls", "cert_file and key_file"}},
		{"bad client_auth", func(c *Config) { c.MQTT.TLS.ClientAuth = "maybe" }, []string{"mqtt.tls.client_auth", "none, request or require"}},
		{"require without CA", func(c *Config) {
			c.MQTT.TLS = TLSConfig{CertFile: "c", KeyFile: "k", ClientAuth: "require"}
		}, []string{"mqtt.tls.client_auth", "client_ca_file"}},
		{"cert identity without client certs", func(c *Config) {
			c.MQTT.TLS = TLSConfig{CertFile: "c", KeyFile: "k", CertIdentity: true}
		}, []string{"mqtt.tls.cert_identity"}},
	}
	for _, tc := range cases {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		err := cfg.Validate()
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: valid, want an error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, w)
			}
		}
	}
}

// writeAuthFile writes a file for the node's auth config.
func writeAuthFile(tb testing.TB, dir, name, content string) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// usersFile is a users file line for name with password pw.
func userLine(tb testing.TB, name, pw string) string {
	tb.Helper()
	h, err := auth.HashPassword(pw)
	if err != nil {
		tb.Fatal(err)
	}
	return name + ":" + h + "\n"
}

// dialUser connects with a user name and password and returns the client,
// whatever the CONNACK says.
func dialUser(tb testing.TB, n *Node, id string, version byte, user, pw string) *mqtttest.Raw {
	tb.Helper()
	conn := dialMQTT(tb, n)
	return mqtttest.Handshake(tb, conn, mqtttest.Connect{ClientID: id, Version: version, Clean: true, Keepalive: 60,
		Username: user, Password: pw})
}

func dialMQTT(tb testing.TB, n *Node) net.Conn {
	tb.Helper()
	conn, err := net.Dial("tcp", n.MQTTAddr().String())
	if err != nil {
		tb.Fatal(err)
	}
	return conn
}

// closedOrDenied reads until c's publish is refused: a PUBACK with a
// failure code, or (MQTT 3.1.1) the connection closed. It reports false
// on a successful PUBACK.
func closedOrDenied(c *mqtttest.Raw) bool {
	for {
		pk, err := c.Next()
		if err != nil {
			return true
		}
		if pk.FixedHeader.Type == packets.Puback {
			return pk.ReasonCode >= packets.ErrUnspecifiedError.Code
		}
	}
}

// A node with users and an ACL: passwords are checked, the ACL binds
// publishes, subscriptions and deliveries, and SIGHUP's reload applies
// new rules to connected clients or, when the files are bad, keeps the
// old ones.
func TestNode_UsersACLAndReload(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.Auth.UsersFile = writeAuthFile(t, dir, "users", userLine(t, "alice", "pw-a")+userLine(t, "bob", "pw-b"))
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", `
deny  read      *          test/nosubscribe
allow readwrite user:alice #
allow read      user:bob   sensors/#
`)
	n := startNode(t, cfg)

	for version, want := range map[byte]byte{5: packets.ErrBadUsernameOrPassword.Code, 4: 4} {
		for _, cred := range [][2]string{{"alice", "wrong"}, {"nobody", "pw-a"}, {"", ""}} {
			c := dialUser(t, n, "x", version, cred[0], cred[1])
			if c.Connack.ReasonCode != want {
				t.Errorf("v%d %q/%q: CONNACK %#x, want %#x", version, cred[0], cred[1], c.Connack.ReasonCode, want)
			}
		}
	}

	alice := dialUser(t, n, "alice-1", 5, "alice", "pw-a")
	bob := dialUser(t, n, "bob-1", 4, "bob", "pw-b")
	if alice.Connack.ReasonCode != 0 || bob.Connack.ReasonCode != 0 {
		t.Fatalf("CONNACKs %#x, %#x: right passwords refused", alice.Connack.ReasonCode, bob.Connack.ReasonCode)
	}
	if ack := alice.TrySubscribe("test/nosubscribe", 1); ack.ReasonCodes[0] != packets.ErrNotAuthorized.Code {
		t.Errorf("test/nosubscribe: SUBACK %#x, want 0x87", ack.ReasonCodes[0])
	}
	if ack := bob.TrySubscribe("test/nosubscribe", 1); ack.ReasonCodes[0] != packets.ErrUnspecifiedError.Code {
		t.Errorf("test/nosubscribe (3.1.1): SUBACK %#x, want 0x80", ack.ReasonCodes[0])
	}
	bob.Subscribe("#", 1) // granted: bob may read sensors/#
	alice.Subscribe("#", 1)

	pub := func(topic string, id uint16) {
		t.Helper()
		alice.Publish(topic, 1, id, "m")
	}
	pub("test/nosubscribe", 1)
	pub("other/x", 2)
	pub("sensors/a", 3)
	expectTopics(t, bob, "sensors/a")              // not other/x: bob may not read it
	expectTopics(t, alice, "other/x", "sensors/a") // not test/nosubscribe

	// bob may not write.
	bob.Publish("sensors/b", 1, 9, "m")
	if !closedOrDenied(bob) {
		t.Error("bob's publish to sensors/b was accepted")
	}

	// A new rule, reloaded: connected clients follow it.
	writeAuthFile(t, dir, "acl", `
deny  read      *          test/nosubscribe
deny  read      *          sensors/secret
allow readwrite user:alice #
`)
	if err := n.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	pub("sensors/secret", 4)
	pub("sensors/open", 5)
	expectTopics(t, alice, "sensors/open")

	// A bad file: the reload fails, the rules stay.
	writeAuthFile(t, dir, "acl", "allow everything\n")
	if err := n.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("Reload of a bad ACL: %v, want an error naming line 1", err)
	}
	pub("sensors/secret", 6)
	pub("sensors/open2", 7)
	expectTopics(t, alice, "sensors/open2")
	if c := dialUser(t, n, "alice-2", 5, "alice", "pw-a"); c.Connack.ReasonCode != 0 {
		t.Errorf("after a failed reload alice is refused: %#x", c.Connack.ReasonCode)
	}
}

// An auth file that cannot be read or is invalid stops the start.
func TestNode_BadAuthFileFailsClosed(t *testing.T) {
	dir := t.TempDir()
	for name, mutate := range map[string]func(*Config){
		"missing users file": func(c *Config) { c.Auth.UsersFile = filepath.Join(dir, "none") },
		"plain-text users":   func(c *Config) { c.Auth.UsersFile = writeAuthFile(t, dir, "plain", "alice:secret\n") },
		"unreadable ACL": func(c *Config) {
			c.Auth.AllowAnonymous = true
			c.Auth.ACLFile = writeAuthFile(t, dir, "acl", "allow read * a\n")
			if err := os.Chmod(c.Auth.ACLFile, 0); err != nil {
				t.Fatal(err)
			}
			if os.Geteuid() == 0 { // root reads it anyway: make it a directory
				c.Auth.ACLFile = dir
			}
		},
	} {
		cfg := testConfig(t)
		mutate(&cfg)
		node, err := New(cfg, nil)
		if err != nil {
			t.Fatalf("%s: New: %v", name, err)
		}
		err = node.Start(context.Background())
		if err == nil {
			t.Errorf("%s: started", name)
			continue
		}
		if !strings.Contains(err.Error(), "auth") {
			t.Errorf("%s: error %q does not name the auth files", name, err)
		}
		_ = node.Close(context.Background())
	}
}

// expectTopics reads PUBLISHes, acknowledging them, and checks their
// topics are want, in order.
func expectTopics(tb testing.TB, c *mqtttest.Raw, want ...string) {
	tb.Helper()
	var got []string
	for len(got) < len(want) {
		pk := c.Read()
		switch pk.FixedHeader.Type {
		case packets.Publish:
			if pk.FixedHeader.Qos > 0 {
				c.Puback(pk.PacketID)
			}
			got = append(got, pk.TopicName)
		case packets.Puback, packets.Suback, packets.Pingresp:
		default:
			tb.Fatalf("packet type %d", pk.FixedHeader.Type)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		tb.Fatalf("delivered %v, want %v", got, want)
	}
}

// A users file made by Debian's mosquitto_passwd, used as it is, with
// Debian's mosquitto_pub: the right password publishes, a wrong one is
// refused with MQTT 3.1.1's "bad user name or password" (code 4), which
// the client reports as such.
func TestNode_MosquittoPasswdFileWithMosquittoPub(t *testing.T) {
	passwdTool, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Fatalf("mosquitto_passwd not found (Debian: apt-get install mosquitto; scripts/test-deps.sh installs it): %v", err)
	}
	pubTool, err := exec.LookPath("mosquitto_pub")
	if err != nil {
		t.Fatalf("mosquitto_pub not found (Debian: apt-get install mosquitto-clients): %v", err)
	}
	users := filepath.Join(t.TempDir(), "passwd")
	if out, err := exec.Command(passwdTool, "-c", "-b", users, "meter", "s3cret").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v: %s", err, out)
	}
	cfg := testConfig(t)
	cfg.Auth.UsersFile = users
	n := startNode(t, cfg)
	host, port, _ := net.SplitHostPort(n.MQTTAddr().String())
	pub := func(pw string) (string, error) {
		out, err := exec.Command(pubTool, "-h", host, "-p", port, "-u", "meter", "-P", pw,
			"-q", "1", "-t", "meters/1", "-m", "42").CombinedOutput()
		return string(out), err
	}
	if out, err := pub("s3cret"); err != nil {
		t.Fatalf("right password: %v: %s", err, out)
	}
	out, err := pub("wrong")
	if err == nil || !strings.Contains(strings.ToLower(out), "bad user name or password") {
		t.Fatalf("wrong password: %v, output %q; want a refusal saying bad user name or password", err, out)
	}
}

// The ACL file's rules through $share subscriptions (mochi asks about the
// whole $share/<group>/<filter>): granted where the inner filter may be
// read, and each record checked.
func TestNode_ACLAndSharedSubscriptions(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.Auth.AllowAnonymous = true
	cfg.Auth.ACLFile = writeAuthFile(t, dir, "acl", "deny read * secret/#\nallow readwrite * #\n")
	n := startNode(t, cfg)
	c := dialUser(t, n, "sub", 5, "", "")
	if ack := c.TrySubscribe("$share/g/secret/#", 1); ack.ReasonCodes[0] != packets.ErrNotAuthorized.Code {
		t.Errorf("$share/g/secret/#: SUBACK %#x, want 0x87", ack.ReasonCodes[0])
	}
	c.Subscribe("$share/g/#", 1)
	p := dialUser(t, n, "pub", 5, "", "")
	p.Publish("secret/a", 1, 1, "x")
	p.Publish("open/a", 1, 2, "y")
	expectTopics(t, c, "open/a")
}
