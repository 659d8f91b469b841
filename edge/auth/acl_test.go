package auth

import (
	"strings"
	"testing"

	"github.com/peatmq/peat/logstore"
)

func parseACL(tb testing.TB, text string) *ACL {
	tb.Helper()
	acl, err := ParseACL(strings.NewReader(text))
	if err != nil {
		tb.Fatalf("ParseACL: %v", err)
	}
	return acl
}

// accessFor builds the Access of user/client under an ACL text.
func accessFor(tb testing.TB, text, user, client string) *Access {
	tb.Helper()
	a := &Auth{}
	a.cur.Store(&ruleset{acl: parseACL(tb, text)})
	return &Access{a: a, user: user, client: client, anonymous: user == ""}
}

func TestACL_FirstMatchWinsDefaultDeny(t *testing.T) {
	x := accessFor(t, `
# order matters
deny  read      *          sensors/secret/#
allow readwrite *          sensors/#
allow read      user:ops   sensors/secret/#
`, "ops", "c1")
	for topic, want := range map[string]bool{
		"sensors/a":          true,
		"sensors/secret/x":   false, // the deny comes first, whoever the user
		"sensors":            true,  // sensors/# matches its parent
		"other/topic":        false, // no rule: deny
		"$SYS/broker/uptime": false, // # does not match $ topics
	} {
		if got := x.MayRead(topic, topic); got != want {
			t.Errorf("read %s: %v, want %v", topic, got, want)
		}
	}
	if x.MayPublish("other/topic") || !x.MayPublish("sensors/a") {
		t.Error("write: want sensors/a allowed, other/topic denied")
	}
}

// mochi v2.7.9's ledger let a filter a/b match the topic a/b/c (prefix
// match; the comqtt#169 ACL bypass), walked rules in map order, and allowed
// on no match. None of that here.
func TestACL_MochiLedgerCases(t *testing.T) {
	x := accessFor(t, "allow readwrite * a/b\n", "u", "c")
	if x.MayPublish("a/b/c") || x.MayRead("a/b/c", "a/b/c") {
		t.Error("a filter a/b matched the topic a/b/c")
	}
	if !x.MayPublish("a/b") {
		t.Error("a/b denied")
	}
	if x.MayPublish("z") {
		t.Error("no rule matched and the answer was yes")
	}
	// Order is the file's, every time (a map would vary between runs).
	for range 50 {
		y := accessFor(t, "deny read * t/#\nallow read * t/x\nallow read * #\n", "u", "c")
		if y.MayRead("t/x", "t/x") || !y.MayRead("u", "u") {
			t.Fatal("rules not applied in file order")
		}
	}
}

// CVE-2017-7650: a client id or user name holding + or # turned a pattern
// rule into a wildcard. Such a name never stands in for a level; a / would
// shift levels, and an empty name would match a level "".
func TestACL_SubstitutionIsAWholeLevelOfASafeName(t *testing.T) {
	const rules = `
deny  readwrite *   devices/%c/private
allow readwrite *   devices/%c/#
allow readwrite *   users/%u/#
allow readwrite *   lit/dev-%c
`
	good := accessFor(t, rules, "alice", "dev1")
	for topic, want := range map[string]bool{
		"devices/dev1/t":       true,
		"devices/dev2/t":       false,
		"devices/dev1/private": false,
		"users/alice/x":        true,
		"users/bob/x":          false,
		"lit/dev-dev1":         false, // %c inside a level is literal
		"lit/dev-%c":           true,
	} {
		if got := good.MayPublish(topic); got != want {
			t.Errorf("alice/dev1 publish %s: %v, want %v", topic, got, want)
		}
	}
	for _, id := range []string{"#", "+", "a/b", "dev1/#", ""} {
		x := accessFor(t, rules, id, id)
		for _, topic := range []string{"devices/dev1/t", "devices/x/t", "devices/a/b/t", "devices//t", "users/alice/x", "users/a/b/x"} {
			if x.MayPublish(topic) || x.MayRead(topic, topic) {
				t.Errorf("name %q: %s allowed through a substituted rule", id, topic)
			}
		}
		// The deny rule still binds, widened: no private topic is readable
		// through any later rule.
		if x.MaySubscribe("devices/+/private") {
			t.Errorf("name %q: devices/+/private subscribable", id)
		}
	}
}

func TestACL_RulesByUserAndClient(t *testing.T) {
	const rules = `
allow readwrite user:alice  a/#
allow readwrite client:dev7 d/#
`
	if x := accessFor(t, rules, "alice", "any"); !x.MayPublish("a/1") || x.MayPublish("d/1") {
		t.Error("user rule")
	}
	if x := accessFor(t, rules, "bob", "dev7"); x.MayPublish("a/1") || !x.MayPublish("d/1") {
		t.Error("client rule")
	}
	if x := accessFor(t, rules, "", "x"); x.MayPublish("a/1") {
		t.Error("anonymous matched a user rule")
	}
}

// The conformance suite's subscription failure case: a broker configured
// to deny test/nosubscribe refuses that subscription, but not others.
func TestACL_NoSubscribe(t *testing.T) {
	x := accessFor(t, "deny read * test/nosubscribe\nallow readwrite * #\n", "", "c")
	if x.MaySubscribe("test/nosubscribe") {
		t.Error("test/nosubscribe subscribable")
	}
	for _, f := range []string{"test/#", "#", "test/+", "test/other"} {
		if !x.MaySubscribe(f) {
			t.Errorf("%s refused", f)
		}
	}
	if x.MayRead("test/#", "test/nosubscribe") {
		t.Error("test/nosubscribe delivered through test/#")
	}
}

func TestACL_SubscriptionAnswers(t *testing.T) {
	grants := parseACL(t, `
deny  read * secret/#
allow read * sensors/#
allow read * +/public
`).forClient("u", "c", false)
	for _, c := range []struct {
		filter       string
		may, readAll bool
	}{
		{"sensors/#", true, true},
		{"sensors/+/t", true, true},
		{"#", true, false},
		{"secret/#", false, false},
		{"secret/x", false, false},
		{"+/public", true, false}, // secret/public is denied first
		{"x/public", true, true},
		{"other", false, false},
		{"$SYS/#", false, false},
	} {
		if got := maySubscribe(grants, c.filter); got != c.may {
			t.Errorf("maySubscribe(%s) = %v, want %v", c.filter, got, c.may)
		}
		if got := readsAll(grants, c.filter); got != c.readAll {
			t.Errorf("readsAll(%s) = %v, want %v", c.filter, got, c.readAll)
		}
	}
}

func TestACL_BadFileFailsClosed(t *testing.T) {
	for _, text := range []string{
		"allow read *",
		"permit read * a",
		"allow readonly * a",
		"allow read someone a",
		"allow read * a/#/b",
		"allow read * a+",
	} {
		if _, err := ParseACL(strings.NewReader("allow read * ok\n" + text + "\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: error %v, want one naming line 2", text, err)
		}
	}
}

// splitFuzz turns fuzz bytes into a valid filter, or "".
func validOrEmpty(f string) string {
	if logstore.ValidateFilter(f) != nil {
		return ""
	}
	return f
}

// The ACL matcher: covers and overlaps agree with logstore.MatchFilter on
// every topic, and a decision never panics and never lets a substituted
// name widen a rule.
func FuzzACL_Matcher(f *testing.F) {
	seeds := [][3]string{
		{"a/#", "a/b", "a/b"}, {"#", "$SYS/#", "$SYS/x"}, {"+/+", "a/#", "a"}, {"a/+/c", "a/b/#", "a/b/c"},
		{"#", "#", ""}, {"a//b", "a/+/b", "a//b"}, {"+", "$x", "$x"}, {"a/b", "a/b/c", "a/b/c"},
		{"devices/%c/#", "#", "devices/x/y"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], "client")
	}
	f.Fuzz(func(t *testing.T, a, b, topic, id string) {
		a, b = validOrEmpty(a), validOrEmpty(b)
		if a == "" || b == "" || topic == "" || strings.ContainsAny(topic, "+#\x00") || len(topic) > 256 {
			return
		}
		ma, mb := logstore.MatchFilter(a, topic), logstore.MatchFilter(b, topic)
		if covers(a, b) && mb && !ma {
			t.Fatalf("covers(%q, %q) but %q matches only the second", a, b, topic)
		}
		if ma && mb && !overlaps(a, b) {
			t.Fatalf("%q matches %q and %q, but overlaps says no", topic, a, b)
		}
		if a == b && !covers(a, b) {
			t.Fatalf("covers(%q, itself) is false", a)
		}
		// A rule set allowing only the client's own subtree: whatever the
		// id, a topic is allowed only inside devices/<id>/, with id a
		// single safe level.
		x := accessFor(t, "deny read * devices/%c/private\nallow readwrite * devices/%c/#\n", "u", id)
		if x.MayPublish(topic) {
			lv := strings.Split(topic, "/")
			if len(lv) < 2 || lv[0] != "devices" || lv[1] != id || strings.ContainsAny(id, "+#/") || id == "" {
				t.Fatalf("client %q may publish to %q", id, topic)
			}
		}
		if x.MaySubscribe(b) {
			// Some topic of b must really be readable: the witness of the
			// client's subtree within b.
			if strings.ContainsAny(id, "+#/") || id == "" {
				t.Fatalf("client %q may subscribe to %q", id, b)
			}
		}
		_ = x.MayRead(b, topic)
	})
}

// The file parsers take whatever a file holds: an error or a result,
// never a panic, and a result that only holds what a file may say.
func FuzzParseFiles(f *testing.F) {
	f.Add("allow readwrite * devices/%c/#\ndeny read user:x #\n")
	f.Add(mosquittoVectors)
	f.Add("ops:admin:" + strings.Repeat("ab", 32) + "\n")
	f.Add("a:$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\n")
	f.Fuzz(func(t *testing.T, text string) {
		if acl, err := ParseACL(strings.NewReader(text)); err == nil {
			for _, ru := range acl.rules {
				if logstore.ValidateFilter(strings.Join(ru.levels, "/")) != nil {
					t.Fatalf("rule on line %d has an invalid filter", ru.line)
				}
			}
		}
		if us, err := ParseUsers(strings.NewReader(text)); err == nil {
			for name, u := range us.m {
				if name == "" || u.h == nil {
					t.Fatalf("user %q without a hash", name)
				}
			}
		}
		_, _ = parseTokens(strings.NewReader(text))
	})
}
