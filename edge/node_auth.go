package edge

import (
	"errors"
	"log/slog"

	"github.com/peatmq/peat/mqtt"
)

// Attribute keys of the auth log lines.
const (
	attrUsers    = "users"
	attrACLRules = "acl_rules"
)

// ErrNoAuth is Reload's answer on a node that runs without auth files.
var ErrNoAuth = errors.New("edge: no auth.users_file, auth.acl_file or http.tokens_file to reload")

// secureBroker reads the auth files and TLS material into bc. A file that
// cannot be read or is invalid fails the start: Peat never serves with
// half its rules.
func (n *Node) secureBroker(bc *mqtt.Config) error {
	a, err := n.cfg.newAuth()
	if err != nil {
		return err
	}
	if a != nil {
		n.auth.Store(a)
		bc.Auth = mqttAuth{a}
		users, rules := a.Counts()
		n.log.Info("auth loaded", attrUsers, users, attrACLRules, rules)
	}
	if bc.TLS, err = n.cfg.mqttTLS(); err != nil {
		return err
	}
	return nil
}

// Reload reads the users and ACL files again (SIGHUP) and applies them to
// every client, connected ones included. When a file cannot be read or is
// invalid, the rules in force stay and the error says why.
func (n *Node) Reload() error {
	a := n.auth.Load()
	if a == nil && n.tokens.Load() == nil {
		return ErrNoAuth
	}
	var errs []error
	if a != nil {
		if err := a.Reload(); err != nil {
			n.log.Error("auth reload failed; keeping the rules in force", attrErr, err)
			errs = append(errs, err)
		} else {
			users, rules := a.Counts()
			n.log.Info("auth reloaded", attrUsers, users, attrACLRules, rules)
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
			slog.String("mqtt.listen", n.cfg.MQTT.Listen))
	case n.auth.Load() == nil:
		n.log.Warn("auth.allow_anonymous without users or ACL: every client that reaches the listener may publish and read",
			slog.String("mqtt.listen", n.cfg.MQTT.Listen))
	}
}
