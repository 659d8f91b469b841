package auth

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
)

// Role is what an HTTP API token may do.
type Role string

// Roles: read may GET everything the API shows; admin may also change
// things (every other method).
const (
	RoleRead  Role = "read"
	RoleAdmin Role = "admin"
)

// Tokens are the HTTP API's bearer tokens, from a tokens file: one
// "name:role:sha256" line each, the SHA-256 of the token in hex, so the
// file holds no token. Blank lines and lines starting with # are skipped.
// `peat token` writes a line and prints the token once.
type Tokens struct {
	path string
	cur  atomic.Pointer[[]token]
}

type token struct {
	name string
	role Role
	sum  [sha256.Size]byte
}

// LoadTokens reads a tokens file; a file with any bad line is refused.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the file again; on an error the tokens in force stay.
func (t *Tokens) Reload() error {
	f, err := os.Open(t.path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	defer f.Close()
	toks, err := parseTokens(f)
	if err != nil {
		return fmt.Errorf("tokens file %s: %w", t.path, err)
	}
	t.cur.Store(&toks)
	return nil
}

// Len is the number of tokens in force.
func (t *Tokens) Len() int { return len(*t.cur.Load()) }

// parseTokens reads the lines of a tokens file.
func parseTokens(r io.Reader) ([]token, error) {
	var out []token
	var probs []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) != 3 || parts[0] == "" {
			probs = append(probs, fmt.Sprintf("line %d: want name:role:sha256-hex", n))
			continue
		}
		tk := token{name: parts[0], role: Role(parts[1])}
		if tk.role != RoleRead && tk.role != RoleAdmin {
			probs = append(probs, fmt.Sprintf("line %d: role %q: want read or admin", n, parts[1]))
			continue
		}
		sum, err := hex.DecodeString(parts[2])
		if err != nil || len(sum) != sha256.Size {
			probs = append(probs, fmt.Sprintf("line %d: not the hex SHA-256 of a token (64 hex digits)", n))
			continue
		}
		if seen[tk.name] {
			probs = append(probs, fmt.Sprintf("line %d: token %q listed twice", n, tk.name))
			continue
		}
		seen[tk.name] = true
		copy(tk.sum[:], sum)
		out = append(out, tk)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(probs, "; "))
	}
	return out, nil
}

// Check returns the name and role of the token presented, or false. Every
// stored hash is compared, in constant time.
func (t *Tokens) Check(presented string) (name string, role Role, ok bool) {
	sum := sha256.Sum256([]byte(presented))
	for _, tk := range *t.cur.Load() {
		if subtle.ConstantTimeCompare(sum[:], tk.sum[:]) == 1 {
			name, role, ok = tk.name, tk.role, true
		}
	}
	return name, role, ok
}

// NewToken makes a random token (32 bytes, URL-safe base64) and its
// tokens-file line.
func NewToken(name string, role Role) (tok, line string, err error) {
	if role != RoleRead && role != RoleAdmin {
		return "", "", fmt.Errorf("role %q: want read or admin", role)
	}
	if name == "" || strings.ContainsAny(name, ": \t\r\n") {
		return "", "", fmt.Errorf("name %q: must not be empty or hold ':' or spaces", name)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	tok = base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(tok))
	return tok, fmt.Sprintf("%s:%s:%s", name, role, hex.EncodeToString(sum[:])), nil
}
