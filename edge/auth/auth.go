package auth

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// Config says where the rules come from. YAML lives in edge.
type Config struct {
	// UsersFile is a users file (Users); empty: user names are not
	// checked, and a client that gives one is anonymous.
	UsersFile string
	// ACLFile is an ACL file (ACL); empty: a client that is let in may
	// do everything.
	ACLFile string
	// AllowAnonymous lets in clients that give no user name (or, without
	// UsersFile, any name).
	AllowAnonymous bool
	// CertIdentity makes the first name of a client's verified TLS
	// certificate (its CN, else its first SAN) the client's user name,
	// with no password asked.
	CertIdentity bool
	// MaxConcurrentHashes bounds the password hashes computed at once;
	// 0 is one less than GOMAXPROCS, at least 1.
	MaxConcurrentHashes int
}

// Auth answers who may connect and what each client may do, from a users
// file and an ACL file. Reload reads both again; until it succeeds, the
// rules it had stay.
type Auth struct {
	cfg Config
	v   *verifier
	cur atomic.Pointer[ruleset]
}

// ruleset is one generation of the rules: what the files held when they
// were last read.
type ruleset struct {
	users *Users // nil without UsersFile
	acl   *ACL   // nil without ACLFile
}

// New reads the files cfg names. A file that cannot be read or holds a
// bad line is an error: Peat does not start on half the rules.
func New(cfg Config) (*Auth, error) {
	v, err := newVerifier(cfg.MaxConcurrentHashes)
	if err != nil {
		return nil, err
	}
	a := &Auth{cfg: cfg, v: v}
	set, err := a.load()
	if err != nil {
		return nil, err
	}
	a.cur.Store(set)
	return a, nil
}

// Reload reads the files again and, if both are good, makes them the
// rules for every client, connected ones included. On an error the
// rules stay as they were.
func (a *Auth) Reload() error {
	set, err := a.load()
	if err != nil {
		return err
	}
	a.cur.Store(set)
	return nil
}

// Counts returns how many users and ACL rules are in force.
func (a *Auth) Counts() (users, rules int) {
	set := a.cur.Load()
	if set.users != nil {
		users = set.users.Len()
	}
	if set.acl != nil {
		rules = set.acl.Rules()
	}
	return users, rules
}

func (a *Auth) load() (*ruleset, error) {
	set := &ruleset{}
	var errs []error
	if a.cfg.UsersFile != "" {
		us, err := loadFile(a.cfg.UsersFile, ParseUsers)
		if err != nil {
			errs = append(errs, fmt.Errorf("users file: %w", err))
		}
		set.users = us
	}
	if a.cfg.ACLFile != "" {
		acl, err := loadFile(a.cfg.ACLFile, ParseACL)
		if err != nil {
			errs = append(errs, fmt.Errorf("ACL file: %w", err))
		}
		set.acl = acl
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return set, nil
}

func loadFile[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, err
	}
	defer f.Close()
	v, err := parse(f)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// Authenticate checks a connecting client: its certificate names (when
// CertIdentity is set and it presented a verified one), else its user
// name and password. It returns the client's Access, or why it is
// refused.
func (a *Auth) Authenticate(clientID, username string, password []byte, certNames []string) (*Access, string, bool) {
	set := a.cur.Load()
	x := &Access{a: a, client: clientID}
	switch {
	case a.cfg.CertIdentity && len(certNames) > 0:
		x.user = certNames[0]
	case set.users == nil:
		if !a.cfg.AllowAnonymous {
			return nil, "anonymous clients are not allowed (auth.allow_anonymous)", false
		}
		x.anonymous = true // a name nobody checked is no identity
	case username == "":
		if !a.cfg.AllowAnonymous {
			return nil, "no user name, and anonymous clients are not allowed (auth.allow_anonymous)", false
		}
		x.anonymous = true
	default:
		if !a.v.verify(set.users, username, password) {
			return nil, "bad user name or password", false
		}
		x.user, x.hash = username, set.users.m[username].raw
	}
	return x, "", true
}

// Access is what one client may do, under the rules in force: it follows
// Reload. Its answers for subscription filters and topics are cached
// until the rules change.
type Access struct {
	a         *Auth
	user      string
	client    string
	anonymous bool
	hash      string // the user's line when it logged in (revoke.go); "" unless by password

	mu struct {
		sync.Mutex
		set     *ruleset // the rules grants were built from
		revoked bool     // set's users file no longer has the line the client logged in with
		grants  []grant  // nil with no ACL: everything allowed
		readAll map[string]bool
		topics  map[string]bool
	}
}

// User is the client's user name, "" when anonymous.
func (x *Access) User() string { return x.user }

// accessCacheSize bounds each of a client's caches; when full, a cache
// starts again empty.
const accessCacheSize = 1024

// currentLocked returns the client's grants under the rules in force,
// with x.mu held; acl false means no ACL (everything allowed).
func (x *Access) currentLocked() (grants []grant, acl bool) {
	set := x.a.cur.Load()
	if x.mu.set != set {
		x.mu.set = set
		x.mu.grants = nil
		x.mu.revoked = x.revokedBy(set) != ""
		if set.acl != nil && !x.mu.revoked {
			x.mu.grants = set.acl.forClient(x.user, x.client, x.anonymous)
		}
		x.mu.readAll = map[string]bool{}
		x.mu.topics = map[string]bool{}
	}
	return x.mu.grants, set.acl != nil || x.mu.revoked
}

// MayPublish reports whether the client may publish to topic.
func (x *Access) MayPublish(topic string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	grants, acl := x.currentLocked()
	return !acl || decide(grants, topic, true)
}

// MaySubscribe reports whether some topic matching filter may be read.
func (x *Access) MaySubscribe(filter string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	grants, acl := x.currentLocked()
	return !acl || maySubscribe(grants, filter)
}

// MayRead reports whether the client may receive a record of topic
// delivered for its subscription to filter: at once when the filter lies
// wholly inside what the client may read, else by the topic.
func (x *Access) MayRead(filter, topic string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	grants, acl := x.currentLocked()
	if !acl {
		return true
	}
	all, ok := x.mu.readAll[filter]
	if !ok {
		all = readsAll(grants, filter)
		if len(x.mu.readAll) >= accessCacheSize {
			clear(x.mu.readAll)
		}
		x.mu.readAll[filter] = all
	}
	if all {
		return true
	}
	may, ok := x.mu.topics[topic]
	if !ok {
		may = decide(grants, topic, false)
		if len(x.mu.topics) >= accessCacheSize {
			clear(x.mu.topics)
		}
		x.mu.topics[topic] = may
	}
	return may
}
