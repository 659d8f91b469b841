package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/peatmq/peat/cluster/rules"

	"github.com/peatmq/peat/cluster/wire"
)

func newKey(tb testing.TB) string {
	tb.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		tb.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(k)
}

func writeKeyring(tb testing.TB, path string, keys ...string) {
	tb.Helper()
	data, err := json.Marshal(keys)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

func readKeyring(tb testing.TB, path string) []string {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var keys []string
	if err := json.Unmarshal(data, &keys); err != nil {
		tb.Fatalf("keyring %s: %v", path, err)
	}
	return keys
}

// aliveIDs is the ids n lists as alive members, sorted.
func aliveIDs(n *Node) []string {
	var ids []string
	for _, m := range n.Members() {
		if m.Status == "alive" {
			ids = append(ids, m.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

// neverListed checks, for as long as memberlist needs for many probe and
// gossip rounds, that no node in nodes lists id.
func neverListed(t *testing.T, nodes []*Node, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second) // 10 probe intervals
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			for _, m := range n.Members() {
				if m.ID == id {
					t.Fatalf("%s lists %s (%s): a node with the wrong key joined", n.ID(), id, m.Status)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestKeyring_WrongKeyDoesNotJoinAndRotationKeepsTheSite(t *testing.T) {
	k1, k2, wrong := newKey(t), newKey(t), newKey(t)
	keyDir := t.TempDir()
	keys := map[string][]string{} // node id -> its starting keyring; absent: k1
	keyringOf := func(id string) string { return filepath.Join(keyDir, id+".json") }
	configure := func(id string, cfg *Config) {
		if id == "plain" {
			return // no keyring: gossip in the clear
		}
		ks, ok := keys[id]
		if !ok {
			ks = []string{k1}
		}
		writeKeyring(t, keyringOf(id), ks...)
		cfg.KeyringFile = keyringOf(id)
	}
	s := startSite(t, partsOpts{Voters: 3, Configure: configure})
	site := []string{"n1", "n2", "n3"}
	for _, n := range s.nodes {
		eventually(t, n.ID()+" lists the three members alive", func() bool { return slices.Equal(aliveIDs(n), site) })
	}
	s.controller(s.nodes)

	// A node with another key, and one without encryption, join n1: no
	// member of the site ever lists them, nor they the site.
	keys["x1"] = []string{wrong}
	x1 := s.open("x1", nodeOpts{Join: []string{s.nodes[0].SerfAddr()}, Broker: true})
	plain := s.open("plain", nodeOpts{Join: []string{s.nodes[0].SerfAddr()}, Broker: true})
	neverListed(t, s.nodes, "x1")
	neverListed(t, s.nodes, "plain")
	for _, x := range []*Node{x1, plain} {
		if got := aliveIDs(x); !slices.Equal(got, []string{x.ID()}) {
			t.Fatalf("%s lists %v, want only itself", x.ID(), got)
		}
	}

	// Rotation while running: install k2, use it, remove k1.
	n2 := s.nodes[1]
	if err := n2.InstallKey(k2); err != nil {
		t.Fatal(err)
	}
	got, members, err := n2.ListKeys()
	if err != nil || members != 3 || got[k1] != 3 || got[k2] != 3 || len(got) != 2 {
		t.Fatalf("after install: keys %v from %d members, err %v; want k1 and k2 on 3", got, members, err)
	}
	if err := n2.UseKey(k2); err != nil {
		t.Fatal(err)
	}
	if err := n2.RemoveKey(k1); err != nil {
		t.Fatal(err)
	}
	got, members, err = n2.ListKeys()
	if err != nil || members != 3 || got[k2] != 3 || len(got) != 1 {
		t.Fatalf("after rotation: keys %v from %d members, err %v; want only k2 on 3", got, members, err)
	}
	// Every member wrote its keyring file, as Serf's KeyringFile does.
	for _, id := range site {
		if ks := readKeyring(t, keyringOf(id)); !slices.Equal(ks, []string{k2}) {
			t.Fatalf("%s's keyring file holds %d keys (%v), want only the new one", id, len(ks), ks)
		}
	}
	// Removing the primary key is refused, naming why.
	if err := n2.RemoveKey(k2); err == nil {
		t.Fatal("removing the primary key succeeded")
	}

	// The site stays together under the new key, and a node started with
	// only the new key joins; one with only the removed key does not.
	keys["n4"] = []string{k2}
	n4 := s.open("n4", nodeOpts{Join: []string{s.nodes[0].SerfAddr()}, Broker: true})
	all := append(slices.Clone(s.nodes), n4)
	want := append(slices.Clone(site), "n4")
	for _, n := range all {
		eventually(t, n.ID()+" lists the four members alive", func() bool { return slices.Equal(aliveIDs(n), want) })
	}
	keys["x2"] = []string{k1}
	s.open("x2", nodeOpts{Join: []string{s.nodes[0].SerfAddr()}, Broker: true})
	neverListed(t, all, "x2")
	for _, n := range all {
		if got := aliveIDs(n); !slices.Equal(got, want) {
			t.Fatalf("%s lists %v alive after the rotation, want %v", n.ID(), got, want)
		}
	}
}

func TestKeyring_BadFileFailsOpen(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		"missing":    "",
		"not json":   `k1`,
		"empty":      `[]`,
		"not base64": `["***"]`,
		"bad length": `["` + base64.StdEncoding.EncodeToString([]byte("short")) + `"]`,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
			if content != "" {
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg := DefaultConfig()
			cfg.NodeID, cfg.SerfAddr, cfg.RaftAddr = "n1", "127.0.0.1:0", "127.0.0.1:0"
			cfg.SnapshotDir = t.TempDir()
			cfg.KeyringFile = path
			n, err := Open(cfg, openStore(t, ""))
			if err == nil {
				n.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), "KeyringFile") {
				t.Fatalf("error %q does not name KeyringFile", err)
			}
		})
	}
}

// testCA is a certificate authority made for a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newCA(tb testing.TB, name string) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a node certificate (client and server use, for 127.0.0.1)
// and its key to dir, and returns their paths.
func (ca *testCA) issue(tb testing.TB, dir, id string) (certFile, keyFile string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: id}, DNSNames: []string{id},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return certFile, keyFile
}

func writeFile(tb testing.TB, path string, data []byte) string {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func TestTLS_SiteWorksAndAForeignCertificateIsRefused(t *testing.T) {
	dir := t.TempDir()
	siteCA, foreignCA := newCA(t, "site"), newCA(t, "foreign")
	siteCAFile := writeFile(t, filepath.Join(dir, "site-ca.pem"), siteCA.pem)
	// The intruder trusts the site's CA (and its own, which signed its
	// certificate): only the site's refusal keeps it out.
	bundle := writeFile(t, filepath.Join(dir, "bundle.pem"), append(slices.Clone(foreignCA.pem), siteCA.pem...))

	configure := func(id string, cfg *Config) {
		if id == "x" {
			cert, key := foreignCA.issue(t, dir, id)
			cfg.TLS = &TLSConfig{CAFile: bundle, CertFile: cert, KeyFile: key}
			return
		}
		cert, key := siteCA.issue(t, dir, id)
		cfg.TLS = &TLSConfig{CAFile: siteCAFile, CertFile: cert, KeyFile: key}
	}
	s := startSite(t, partsOpts{Voters: 3, Serve: true, Configure: configure})

	// The site works under TLS: Raft elects, Submit reaches the controller
	// from a follower, replication commits on every replica.
	s.controller(s.nodes)
	s.registered(s.nodes)
	s.replicate(2*time.Second, 2)
	leader := s.createStream(s.nodes)
	appendRecs(t, s.stream(leader), 20, "tls")
	s.converged(s.nodes, 20)

	// A node with a certificate from a foreign CA joins Serf (no keyring
	// here) as a broker; the controller adds it to Raft, but Raft never
	// reaches it: it never learns of a controller nor of the stream.
	x := s.open("x", nodeOpts{Join: []string{s.nodes[0].SerfAddr()}, Broker: true})
	eventually(t, "the site lists x in Serf", func() bool { return slices.Contains(aliveIDs(s.nodes[0]), "x") })

	// Its submits are refused.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctl := s.controller(s.nodes)
	if err := x.submitTo(ctx, ctl.memberAddr(ctl.ID()), mustEncode(t, rules.CreateStream{Name: "x", Replicas: []string{"n1"}})); err == nil {
		t.Fatal("a submit from a foreign certificate was accepted")
	}
	// Its fetches are refused.
	conn, err := x.dialer()(ctx, s.servers[leader].Addr())
	if err == nil {
		req := wire.EpochRequest{Stream: "s", ReplicaID: "x", LeaderEpoch: streamState(leader).LeaderEpoch}
		var resp wire.EpochResponse
		err = (&fetchConn{conn: conn, wait: 5 * time.Second}).roundTrip(wire.KindEpochRequest, req.AppendTo(nil), wire.KindEpochResponse, &resp)
		conn.Close()
	}
	if err == nil {
		t.Fatal("a fetch from a foreign certificate was answered")
	}
	// Raft: the controller adds x as a non-voter; after many heartbeats
	// x has still heard nothing.
	eventually(t, "the controller adds x to Raft", func() bool {
		f := ctl.raft.GetConfiguration()
		if f.Error() != nil {
			return false
		}
		return slices.ContainsFunc(f.Configuration().Servers, func(s raft.Server) bool { return s.ID == "x" })
	})
	time.Sleep(3 * time.Second) // three heartbeat timeouts: not a timing assertion, a wait for what must not come
	if c := x.Controller(); c != "" {
		t.Fatalf("x learned of controller %s over Raft", c)
	}
	if st, _ := x.State(); len(st.Streams) != 0 {
		t.Fatalf("x's state has streams %v: Raft reached it", st.Streams)
	}
	for _, n := range s.nodes {
		if st, _ := n.State(); st.Streams["x"] != nil {
			t.Fatalf("%s's state has x's stream", n.ID())
		}
	}
	// The site still works.
	appendRecs(t, s.stream(leader), 5, "after")
	s.converged(s.nodes, 25)
}

func mustEncode(tb testing.TB, c rules.Command) []byte {
	tb.Helper()
	data, err := rules.EncodeCommand(c)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

func TestTLS_BadFilesFailOpen(t *testing.T) {
	dir := t.TempDir()
	siteCA, foreignCA := newCA(t, "site"), newCA(t, "foreign")
	siteCAFile := writeFile(t, filepath.Join(dir, "site-ca.pem"), siteCA.pem)
	cert, key := siteCA.issue(t, dir, "n1")
	fcert, fkey := foreignCA.issue(t, dir, "f1")
	cases := map[string]struct {
		tls  TLSConfig
		want string
	}{
		"no CA":           {TLSConfig{CertFile: cert, KeyFile: key}, "TLS.CAFile: empty"},
		"missing CA":      {TLSConfig{CAFile: dir + "/nope", CertFile: cert, KeyFile: key}, "TLS.CAFile"},
		"CA not PEM":      {TLSConfig{CAFile: key + "x", CertFile: cert, KeyFile: key}, "TLS.CAFile"},
		"key mismatch":    {TLSConfig{CAFile: siteCAFile, CertFile: cert, KeyFile: fkey}, "TLS.CertFile/KeyFile"},
		"foreign cert":    {TLSConfig{CAFile: siteCAFile, CertFile: fcert, KeyFile: fkey}, "not signed by TLS.CAFile"},
		"no cert, no key": {TLSConfig{CAFile: siteCAFile}, "TLS.CertFile: empty"},
	}
	writeFile(t, key+"x", []byte("not a certificate"))
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.NodeID, cfg.SerfAddr, cfg.RaftAddr = "n1", "127.0.0.1:0", "127.0.0.1:0"
			cfg.SnapshotDir = t.TempDir()
			cfg.TLS = &c.tls
			n, err := Open(cfg, openStore(t, ""))
			if err == nil {
				n.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to name %q", err, c.want)
			}
		})
	}
}

func TestTLS_VerifyNodeIDRefusesCertificatesNamingAnotherNode(t *testing.T) {
	dir := t.TempDir()
	siteCA := newCA(t, "site")
	siteCAFile := writeFile(t, filepath.Join(dir, "site-ca.pem"), siteCA.pem)
	configure := func(id string, cfg *Config) {
		name := id
		if id == "n4" {
			name = "n1" // a site certificate, but n1's
		}
		cert, key := siteCA.issue(t, dir, name)
		cfg.TLS = &TLSConfig{CAFile: siteCAFile, CertFile: cert, KeyFile: key, VerifyNodeID: true}
	}
	s := startSite(t, partsOpts{Voters: 3, Serve: true, Configure: configure})
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	s.createStream(s.nodes) // Submit from a follower over the checked transport

	// A certificate from the site's CA that names no node (an MQTT
	// client's, say) opens no cluster connection.
	cert, key := siteCA.issue(t, dir, "sensor-7")
	sensor, err := loadTLS(&TLSConfig{CAFile: siteCAFile, CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := sensor.dialer(TCPDialer)(ctx, ctl.memberAddr(ctl.ID()))
	if err == nil {
		req := wire.CommandRequest{From: "sensor-7", Command: mustEncode(t, rules.CreateStream{Name: "x", Replicas: []string{"n1"}})}
		var resp wire.CommandResponse
		err = (&fetchConn{conn: conn, wait: 5 * time.Second}).roundTrip(wire.KindCommandRequest, req.AppendTo(nil), wire.KindCommandResponse, &resp)
		conn.Close()
	}
	if err == nil {
		t.Fatal("a certificate naming no member was answered")
	}

	// A node whose certificate names another node is not reached by Raft:
	// the controller dials n4's address and finds n1's name.
	n4 := s.open("n4", nodeOpts{Join: []string{s.nodes[0].SerfAddr()}, Broker: true})
	eventually(t, "the controller adds n4 to Raft", func() bool {
		f := ctl.raft.GetConfiguration()
		return f.Error() == nil && slices.ContainsFunc(f.Configuration().Servers, func(s raft.Server) bool { return s.ID == "n4" })
	})
	time.Sleep(3 * time.Second) // three heartbeat timeouts: a wait for what must not come
	if c := n4.Controller(); c != "" {
		t.Fatalf("n4 learned of controller %s over Raft", c)
	}
	for _, n := range s.nodes {
		if st, _ := n.State(); st.Streams["x"] != nil {
			t.Fatalf("%s's state has the sensor's stream", n.ID())
		}
	}
}
