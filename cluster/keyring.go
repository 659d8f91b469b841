package cluster

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
)

// loadKeyring reads Serf's keyring file: a JSON list of base64 AES keys
// (16, 24 or 32 bytes), the first one primary, as Serf and Consul write
// it. Any problem is an error: a node never falls back to gossip in the
// clear.
func loadKeyring(path string) (*memberlist.Keyring, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: KeyringFile: %w", err)
	}
	var encoded []string
	if err := json.Unmarshal(data, &encoded); err != nil {
		return nil, fmt.Errorf("cluster: KeyringFile %s: not a JSON list of base64 keys: %w", path, err)
	}
	if len(encoded) == 0 {
		return nil, fmt.Errorf("cluster: KeyringFile %s: no keys", path)
	}
	keys := make([][]byte, 0, len(encoded))
	for i, s := range encoded {
		k, err := decodeKey(s)
		if err != nil {
			return nil, fmt.Errorf("cluster: KeyringFile %s: key %d: %w", path, i+1, err)
		}
		keys = append(keys, k)
	}
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, fmt.Errorf("cluster: KeyringFile %s: %w", path, err)
	}
	return kr, nil
}

func decodeKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	if err := memberlist.ValidateKey(k); err != nil {
		return nil, err
	}
	return k, nil
}

// ErrNoKeyring is returned by the key operations of a node started
// without a KeyringFile (its gossip is not encrypted).
var ErrNoKeyring = errors.New("cluster: gossip encryption is off (no KeyringFile)")

// InstallKey adds key (base64) to the keyring of every member, which
// then accept gossip encrypted with it; the primary key is unchanged.
// Each member rewrites its KeyringFile. The error names how many members
// failed or did not answer: the operation is idempotent, repeat it.
func (n *Node) InstallKey(key string) error {
	return n.keyOp("install", key, n.serf.KeyManager().InstallKey)
}

// UseKey makes key, already installed everywhere, the primary key (the
// one gossip is encrypted with) on every member.
func (n *Node) UseKey(key string) error {
	return n.keyOp("use", key, n.serf.KeyManager().UseKey)
}

// RemoveKey removes key from every member's keyring; a member refuses to
// remove its primary key.
func (n *Node) RemoveKey(key string) error {
	return n.keyOp("remove", key, n.serf.KeyManager().RemoveKey)
}

// ListKeys returns, for each key (base64) installed anywhere in the
// site, how many members have it, and how many members answered.
func (n *Node) ListKeys() (keys map[string]int, members int, err error) {
	if !n.serf.EncryptionEnabled() {
		return nil, 0, ErrNoKeyring
	}
	r, err := n.serf.KeyManager().ListKeys()
	if r == nil {
		return nil, 0, fmt.Errorf("cluster: list keys: %w", err)
	}
	keys = maps.Clone(r.Keys)
	if err != nil {
		return keys, r.NumResp, fmt.Errorf("cluster: list keys: %w%s", err, keyMessages(r.Messages))
	}
	return keys, r.NumResp, nil
}

func (n *Node) keyOp(op, key string, do func(string) (*serf.KeyResponse, error)) error {
	if !n.serf.EncryptionEnabled() {
		return ErrNoKeyring
	}
	if _, err := decodeKey(key); err != nil {
		return fmt.Errorf("cluster: %s key: %w", op, err)
	}
	r, err := do(key)
	if err != nil {
		msgs := ""
		if r != nil {
			msgs = keyMessages(r.Messages)
		}
		return fmt.Errorf("cluster: %s key: %w%s", op, err, msgs)
	}
	return nil
}

// keyMessages lists the members' reasons for a failed key operation.
func keyMessages(m map[string]string) string {
	s := ""
	for node, msg := range m {
		if msg != "" {
			s += fmt.Sprintf("; %s: %s", node, msg)
		}
	}
	return s
}
