package auth

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/peatmq/peat/logstore"
)

// ACL is an ordered list of rules, read from an ACL file: for each
// question (may this client read or write this topic), the first rule
// that applies decides; when none does, the answer is no.
//
// One rule per line, fields separated by spaces:
//
//	<allow|deny> <read|write|readwrite> <who> <filter>
//
// who is * (every client), user:<name> or client:<client id>; filter is
// an MQTT topic filter (the rest of the line), in which a level that is
// exactly %u or %c stands for the client's user name or client id. Blank
// lines and lines starting with # are skipped.
type ACL struct {
	rules     []rule
	groups    []objRule // group:<pattern> rules (tenancy.go)
	clientIDs []objRule // connect clientid:<pattern> rules (tenancy.go)
	// clientIDReads are the read clientid:<pattern> rules (tenancy.go).
	clientIDReads []objRule
}

// rule is one line of an ACL file.
type rule struct {
	line        int
	allow       bool
	read, write bool
	user        string // who: user:<name>
	client      string // who: client:<id>
	levels      []string
	subst       bool // a level is %u or %c
}

// ParseACL reads an ACL file. Every problem is reported with its line
// number; a file with any problem is refused as a whole.
func ParseACL(r io.Reader) (*ACL, error) {
	var acl ACL
	var probs []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if or, clientID, ok, err := parseObjectRule(line); ok { // tenancy.go
			switch {
			case err != nil:
				probs = append(probs, fmt.Sprintf("line %d: %v", n, err))
			case clientID && or.read:
				acl.clientIDReads = append(acl.clientIDReads, or)
			case clientID:
				acl.clientIDs = append(acl.clientIDs, or)
			default:
				acl.groups = append(acl.groups, or)
			}
			continue
		}
		ru, err := parseRule(line)
		if err != nil {
			probs = append(probs, fmt.Sprintf("line %d: %v", n, err))
			continue
		}
		ru.line = n
		acl.rules = append(acl.rules, ru)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(probs, "; "))
	}
	return &acl, nil
}

// parseWho reads a rule's who: * (anyone), user:<name> or client:<id>.
func parseWho(who string) (user, client string, err error) {
	switch {
	case who == "*":
	case strings.HasPrefix(who, "user:") && len(who) > len("user:"):
		user = strings.TrimPrefix(who, "user:")
	case strings.HasPrefix(who, "client:") && len(who) > len("client:"):
		client = strings.TrimPrefix(who, "client:")
	default:
		err = fmt.Errorf("%q: want *, user:<name> or client:<client id>", who)
	}
	return user, client, err
}

func parseRule(line string) (rule, error) {
	var ru rule
	fields := strings.Fields(line)
	if len(fields) < 4 {
		return ru, fmt.Errorf("want <allow|deny> <read|write|readwrite> <*|user:NAME|client:ID> <filter>, got %q", line)
	}
	switch fields[0] {
	case "allow":
		ru.allow = true
	case "deny":
	default:
		return ru, fmt.Errorf("%q: want allow or deny", fields[0])
	}
	switch fields[1] {
	case "read":
		ru.read = true
	case "write":
		ru.write = true
	case "readwrite":
		ru.read, ru.write = true, true
	default:
		return ru, fmt.Errorf("%q: want read, write or readwrite", fields[1])
	}
	var err error
	if ru.user, ru.client, err = parseWho(fields[2]); err != nil {
		return ru, err
	}
	// The filter is the rest of the line: topics may hold spaces.
	rest := line
	for range 3 {
		rest = strings.TrimLeft(rest, " \t")
		rest = rest[strings.IndexAny(rest, " \t"):]
	}
	filter := strings.TrimSpace(rest)
	if err := logstore.ValidateFilter(filter); err != nil {
		return ru, err
	}
	ru.levels = strings.Split(filter, "/")
	for _, l := range ru.levels {
		if l == "%u" || l == "%c" {
			ru.subst = true
		}
	}
	return ru, nil
}

// Rules returns how many rules the ACL has.
func (a *ACL) Rules() int {
	return len(a.rules) + len(a.groups) + len(a.clientIDs) + len(a.clientIDReads)
}

// grant is one rule as it applies to one client: %u and %c substituted.
type grant struct {
	allow       bool
	read, write bool
	filter      string
}

// forClient returns the rules that apply to the client, in order, with
// %u and %c substituted. A user name or client id that is empty or holds
// +, # or / cannot stand in for a level (it would widen or shift the
// filter, as a client id "#" did in CVE-2017-7650): an allow rule that
// needs it is left out, and a deny rule gets + there instead, so it
// denies at least as much as it would for any other name.
func (a *ACL) forClient(user, clientID string, anonymous bool) []grant {
	out := make([]grant, 0, len(a.rules))
	for _, ru := range a.rules {
		switch {
		case ru.user != "" && (anonymous || ru.user != user):
			continue
		case ru.client != "" && ru.client != clientID:
			continue
		}
		g := grant{allow: ru.allow, read: ru.read, write: ru.write}
		if !ru.subst {
			g.filter = strings.Join(ru.levels, "/")
			out = append(out, g)
			continue
		}
		levels := make([]string, len(ru.levels))
		ok := true
		for i, l := range ru.levels {
			var v string
			switch l {
			case "%u":
				v = user
				if anonymous {
					v = ""
				}
			case "%c":
				v = clientID
			default:
				levels[i] = l
				continue
			}
			if v != "" && !strings.ContainsAny(v, "+#/") && !strings.ContainsRune(v, 0) {
				levels[i] = v
				continue
			}
			ok = false
			levels[i] = "+"
		}
		if !ok && ru.allow {
			continue
		}
		g.filter = strings.Join(levels, "/")
		out = append(out, g)
	}
	return out
}

// decide is the first matching grant's answer for topic, false when none
// matches.
func decide(grants []grant, topic string, write bool) bool {
	for _, g := range grants {
		if (write && g.write || !write && g.read) && logstore.MatchFilter(g.filter, topic) {
			return g.allow
		}
	}
	return false
}

// maySubscribe reports whether some topic matching filter may be read:
// the first read grant that overlaps it allows, before any deny that
// covers it all. It may say yes for a filter whose every topic turns out
// denied by several partial denies; each record is checked anyway.
func maySubscribe(grants []grant, filter string) bool {
	for _, g := range grants {
		if !g.read || !overlaps(g.filter, filter) {
			continue
		}
		if g.allow {
			return true
		}
		if covers(g.filter, filter) {
			return false
		}
	}
	return false
}

// readsAll reports whether every topic matching filter may be read: an
// allow grant covers it before any deny touches it. It may say no when
// the answer is yes (then each record is checked), never the reverse.
func readsAll(grants []grant, filter string) bool {
	for _, g := range grants {
		if !g.read || !overlaps(g.filter, filter) {
			continue
		}
		if !g.allow {
			return false
		}
		if covers(g.filter, filter) {
			return true
		}
	}
	return false
}

// fresh is a topic level no valid filter has (filters hold no NUL): only
// + and # match it. covers and overlaps build witness topics with it and
// ask logstore.MatchFilter, so they share its rules ($ topics included).
const fresh = "\x00"

// covers reports whether every topic that filter b matches also matches
// filter a. A topic T matching b differs from b's witness (b with fresh in
// place of each wildcard level) only where b has a wildcard, and a
// matches fresh only with a wildcard there, so a matching the witness of
// each length T can have means a matches T. Beyond a's length plus one, a
// matches only through a trailing #, which the longest witness shows.
func covers(a, b string) bool {
	bl := strings.Split(b, "/")
	hash := bl[len(bl)-1] == "#"
	if hash {
		bl = bl[:len(bl)-1]
	}
	w := make([]string, len(bl))
	for i, l := range bl {
		w[i] = l
		if l == "+" {
			w[i] = fresh
		}
	}
	if !hash {
		return logstore.MatchFilter(a, strings.Join(w, "/"))
	}
	maxLen := max(strings.Count(a, "/")+2, len(bl)+1)
	for n := len(bl); n <= maxLen; n++ {
		if n == 0 {
			continue // "#" matches no empty topic
		}
		for len(w) < n {
			w = append(w, fresh)
		}
		if !logstore.MatchFilter(a, strings.Join(w, "/")) {
			return false
		}
	}
	return true
}

// overlaps reports whether some topic matches both filters. If a topic T
// does, the witness of the shortest length both can match (at each level
// a's literal, else b's, else fresh) does too: T is at least that long,
// where either filter has a literal T has it, and elsewhere both have
// wildcards. One witness: linear in the filters' length.
func overlaps(a, b string) bool {
	al, bl := strings.Split(a, "/"), strings.Split(b, "/")
	n := max(minLevels(al), minLevels(bl), 1)
	if n > maxLevels(al) || n > maxLevels(bl) {
		return false
	}
	w := make([]string, n)
	for i := range n {
		w[i] = witnessLevel(al, bl, i)
	}
	t := strings.Join(w, "/")
	return logstore.MatchFilter(a, t) && logstore.MatchFilter(b, t)
}

// minLevels and maxLevels bound the levels of the topics a filter's
// levels match: "a/#" matches "a" and below, "a/+" only two levels.
func minLevels(f []string) int {
	if f[len(f)-1] == "#" {
		return len(f) - 1
	}
	return len(f)
}

func maxLevels(f []string) int {
	if f[len(f)-1] == "#" {
		return math.MaxInt
	}
	return len(f)
}

func witnessLevel(a, b []string, i int) string {
	for _, f := range [2][]string{a, b} {
		if i < len(f) && f[i] != "+" && f[i] != "#" {
			return f[i]
		}
	}
	return fresh
}
