package edge

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/peatmq/peat/mqtt"
)

// Attribute keys of the auth log lines.
const (
	attrUsers    = "users"
	attrACLRules = "acl_rules"
	attrRevoked  = "disconnected" // clients whose identity a reload revoked
)

// ErrNoAuth is Reload's answer on a node that runs without auth files.
var ErrNoAuth = errors.New("edge: no auth file, tokens file or TLS certificate to reload")

// secureBroker reads the auth files and TLS material into bc. A file that
// cannot be read or is invalid fails the start: Peat never serves with
// half its rules.
func (n *Node) secureBroker(bc *mqtt.Config) error {
	a, err := n.cfg.newAuth()
	if err != nil {
		return err
	}
	ls := n.cfg.mqttListeners()
	if a != nil {
		n.auth.Store(a)
		ma := mqttAuth{a: a, certIdentity: map[string]bool{}}
		for _, l := range ls {
			ma.certIdentity[l.name] = l.tls.CertIdentity
		}
		bc.Auth = ma
		users, rules := a.Counts()
		n.log.Info("auth loaded", attrUsers, users, attrACLRules, rules)
	}
	for i, l := range ls {
		tc, kp, err := l.mqttTLS()
		if err != nil {
			return err
		}
		if kp != nil {
			n.keyPairs.add(kp)
		}
		if len(bc.Listeners) == 0 { // the short form: mqtt.listen
			bc.TLS = tc
		} else {
			bc.Listeners[i].TLS = tc
		}
	}
	return nil
}

// keyPairs are the listeners' certificates, which Reload reads again.
type keyPairs struct {
	mu    sync.Mutex
	pairs []*keyPair
}

func (k *keyPairs) add(kp *keyPair) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pairs = append(k.pairs, kp)
}

func (k *keyPairs) all() []*keyPair {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*keyPair(nil), k.pairs...)
}

// Reload reads the users and ACL files again (SIGHUP) and applies them to
// every client, connected ones included: a client whose user was removed
// or given a new password is disconnected (mqtt.Broker.Revoke). When a file cannot be read or is
// invalid, the rules in force stay and the error says why.
func (n *Node) Reload() error {
	a := n.auth.Load()
	pairs := n.keyPairs.all()
	if a == nil && n.tokens.Load() == nil && len(pairs) == 0 {
		return ErrNoAuth
	}
	var errs []error
	for _, kp := range pairs {
		if err := kp.reload(); err != nil {
			n.log.Error("TLS certificate reload failed; keeping the one in use", attrErr, err)
			errs = append(errs, err)
		}
	}
	if a != nil {
		if err := a.Reload(); err != nil {
			n.log.Error("auth reload failed; keeping the rules in force", attrErr, err)
			errs = append(errs, err)
		} else {
			users, rules := a.Counts()
			var revoked int
			if b := n.broker.Load(); b != nil {
				revoked = b.Revoke()
			}
			n.log.Info("auth reloaded", attrUsers, users, attrACLRules, rules, attrRevoked, revoked)
		}
	}
	if err := n.reloadTokens(); err != nil {
		n.log.Error("HTTP tokens reload failed; keeping the tokens in force", attrErr, err)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// logAuth says at start how clients are let in, so an operator reading
// the log sees an open broker for what it is.
func (n *Node) logAuth() {
	switch {
	case n.auth.Load() == nil && !n.cfg.Auth.AllowAnonymous:
		n.log.Info("no auth configured: every client may publish and read; MQTT is served on loopback only",
			slog.Any("mqtt_listeners", n.listenAddrs()))
	case n.auth.Load() == nil:
		n.log.Warn("auth.allow_anonymous without users or ACL: every client that reaches the listener may publish and read",
			slog.Any("mqtt_listeners", n.listenAddrs()))
	}
}

// listenAddrs are the configured MQTT listener addresses, for log lines.
func (n *Node) listenAddrs() []string {
	var out []string
	for _, l := range n.cfg.mqttListeners() {
		out = append(out, l.listen)
	}
	return out
}
