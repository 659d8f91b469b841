package mqtt

import "testing"

// With no allowed_origins, "same origin" is the scheme as well as the
// host: on a ws:// listener only an http:// page of that host and port.
func TestWebSocket_SameOriginComparesScheme(t *testing.T) {
	b := newWSBroker(t, NewMetrics(nil), nil)
	host := b.ListenerAddr("ws").String()
	if _, err := dialWS(t, b, "same", "HTTP://"+host); err != nil {
		t.Fatalf("same origin refused: %v", err)
	}
	for _, origin := range []string{"https://" + host, "file://" + host, "ws://" + host, "null"} {
		if _, err := dialWS(t, b, "other", origin); err == nil {
			t.Errorf("a page of %s connected to ws://%s", origin, host)
		}
	}
}
