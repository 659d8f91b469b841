package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
)

// Security: gossip encryption (keyring.go) and mutual TLS (here).
//
// Gossip is encrypted when Config.KeyringFile names Serf's keyring: a
// JSON list of base64 AES keys (16, 24 or 32 bytes), the first primary,
// the file Serf and Consul write. Memberlist encrypts with the primary
// key and accepts any key of the ring; clear-text gossip is refused
// (GossipVerifyIncoming). A node with another key, or none, never
// appears in the site's member list. Node.InstallKey, UseKey and
// RemoveKey change every member's ring live through Serf's KeyManager (a
// query every member answers; the error names those that failed or did
// not answer, and the operations are idempotent, so repeat them), and
// each member rewrites its KeyringFile (Serf's KeyringFile option), so a
// restart keeps the rotated keys. A rotation: install the new key, use
// it, remove the old one; a member down during it needs the new key in
// its file before it can rejoin.
//
// Config.TLS puts Raft's transport and the cluster transport (Submit,
// replica fetch: every Dial goes through Node's dialer, every Server
// listener through Node.ClusterListener) under TLS 1.3 with client
// certificates. Both sides check the peer's chain against the site's CA
// file only; host names are not checked (nodes are dialled by LAN IP,
// which their certificates need not name). Raft runs on a
// raft.StreamLayer over a TLS listener and dialer. With VerifyNodeID a
// dialled node's certificate must also name (DNS name or common name)
// the member advertising that address, and a connecting peer's must
// name some member: a site certificate issued to an MQTT client opens
// nothing, and a node cannot answer for another's address. (A connecting
// peer is not tied to one member: source addresses prove nothing.) A
// foreign certificate
// fails the handshake: Raft never reaches the node, its fetches and
// submits are refused, and the Server logs the refusal with the peer's
// address. An unreadable or invalid keyring, CA, certificate or key, or
// a certificate the CA did not sign, fails Open with an error naming the
// field: a node never falls back to the clear.

// TLSConfig is the mutual TLS of Raft and the cluster transport (Submit,
// replication): every node presents CertFile and accepts only peers whose
// certificate chains to the site's CA.
type TLSConfig struct {
	CAFile   string // the site's CA (PEM); the only root peers are checked against
	CertFile string // this node's certificate (PEM), for both client and server use
	KeyFile  string // its private key (PEM)

	// VerifyNodeID also checks names (a DNS name or the common name): a
	// dialled node's certificate must name the member that advertises the
	// address dialled, and a connecting peer's must name a member of the
	// site. A certificate the site's CA issued to something else (an MQTT
	// client, say) then opens nothing, and a node cannot answer for
	// another's address.
	VerifyNodeID bool
}

// siteTLS holds the loaded certificates: a client and a server config.
type siteTLS struct {
	server, client *tls.Config
	verifyID       bool
	serf           atomic.Pointer[serf.Serf] // set once Serf runs; until then names cannot be checked
}

// loadTLS reads the files; a missing or bad one is an error naming the
// field (a node never falls back to plain TCP).
func loadTLS(c *TLSConfig) (*siteTLS, error) {
	var errs []error
	if c.CAFile == "" {
		errs = append(errs, errors.New("cluster: TLS.CAFile: empty"))
	}
	if c.CertFile == "" {
		errs = append(errs, errors.New("cluster: TLS.CertFile: empty"))
	}
	if c.KeyFile == "" {
		errs = append(errs, errors.New("cluster: TLS.KeyFile: empty"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: TLS.CAFile: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cluster: TLS.CAFile %s: no PEM certificate", c.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: TLS.CertFile/KeyFile: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("cluster: TLS.CertFile %s: %w", c.CertFile, err)
	}
	// Checked here so that a node with the wrong certificate fails at start,
	// not with every peer refusing it.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: pool(cert.Certificate[1:]),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("cluster: TLS.CertFile %s is not signed by TLS.CAFile %s: %w", c.CertFile, c.CAFile, err)
	}
	t := &siteTLS{verifyID: c.VerifyNodeID}
	t.server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	if c.VerifyNodeID {
		// Runs after the chain is verified.
		t.server.VerifyConnection = func(cs tls.ConnectionState) error {
			name := certNames(cs.PeerCertificates[0])
			for _, m := range t.members() {
				if slices.Contains(name, m.Name) {
					return nil
				}
			}
			return fmt.Errorf("cluster: peer certificate names %v, no member of the site", name)
		}
	}
	// On a LAN nodes are dialled by IP, which node certificates need not
	// name: the client checks the chain to the site's CA, not the name.
	t.client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Always presented (Go's default sends none when the server's CA
		// list does not name its issuer): the server decides, and says why.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		InsecureSkipVerify:   true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("cluster: peer sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		},
	}
	return t, nil
}

func pool(ders [][]byte) *x509.CertPool {
	p := x509.NewCertPool()
	for _, d := range ders {
		if c, err := x509.ParseCertificate(d); err == nil {
			p.AddCert(c)
		}
	}
	return p
}

// tlsHandshakeTimeout bounds a client's handshake.
const tlsHandshakeTimeout = 10 * time.Second

// dialer wraps base in the client side of the site's TLS: the handshake is
// done before the connection is returned, so a peer outside the site
// fails the dial.
func (t *siteTLS) dialer(base Dialer) Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		raw, err := base(ctx, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, t.client)
		hctx, cancel := context.WithTimeout(ctx, tlsHandshakeTimeout)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("cluster: tls to %s: %w", addr, err)
		}
		if t.verifyID {
			if err := t.checkNamesAddr(conn.ConnectionState().PeerCertificates[0], addr); err != nil {
				conn.Close()
				return nil, err
			}
		}
		return conn, nil
	}
}

// ClusterListener wraps ln, the listener of this node's Server, in the
// site's mutual TLS (ln itself without Config.TLS). A peer without a
// certificate from the site's CA fails the handshake at its first
// request, and its connection is closed.
func (n *Node) ClusterListener(ln net.Listener) net.Listener {
	if n.tls == nil {
		return ln
	}
	return tls.NewListener(ln, n.tls.server)
}

// tlsRaftTransport is Raft's transport under the site's TLS: on
// Config.RaftListener when set (dialling with Config.Dial), else on a TCP
// listener on RaftAddr.
func (n *Node) tlsRaftTransport(logger hclog.Logger) (*raft.NetworkTransport, error) {
	ln, base := n.cfg.RaftListener, Dialer(TCPDialer)
	if ln != nil {
		if n.cfg.Dial != nil {
			base = n.cfg.Dial
		}
	} else {
		var err error
		if ln, err = net.Listen("tcp", n.cfg.RaftAddr); err != nil {
			return nil, fmt.Errorf("cluster: raft transport on %s: %w", n.cfg.RaftAddr, err)
		}
	}
	sl := streamLayer{tls.NewListener(ln, n.tls.server), n.tls.dialer(base)}
	return raft.NewNetworkTransportWithLogger(sl, raftMaxPool, raftConnTimeout, logger), nil
}

func (t *siteTLS) members() []serf.Member {
	if s := t.serf.Load(); s != nil {
		return s.Members()
	}
	return nil
}

// checkNamesAddr reports whether cert names the member advertising addr
// (as its cluster or Raft address).
func (t *siteTLS) checkNamesAddr(cert *x509.Certificate, addr string) error {
	for _, m := range t.members() {
		if m.Tags[tagCluster] == addr || m.Tags[tagRaft] == addr {
			if names := certNames(cert); !slices.Contains(names, m.Name) {
				return fmt.Errorf("cluster: %s is %s's address, its certificate names %v", addr, m.Name, names)
			}
			return nil
		}
	}
	return fmt.Errorf("cluster: no member advertises %s", addr)
}

// certNames is what a certificate can name a node by.
func certNames(c *x509.Certificate) []string {
	return append(slices.Clone(c.DNSNames), c.Subject.CommonName)
}
