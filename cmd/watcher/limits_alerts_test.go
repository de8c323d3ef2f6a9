package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

// scrapedSeries returns the samples of metric in a Prometheus text
// exposition: label set (as a series selector) -> value.
func scrapedSeries(body []byte, metric string) map[string]float64 {
	out := map[string]float64{}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(metric) + `(\{[^}]*\})? (\S+)$`)
	for _, line := range strings.Split(string(body), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		out[metric+m[1]] = v
	}
	return out
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// requireAlertsFire runs promtool on the expressions of the named alerts
// of deploy/prometheus/limits.yml with the counters scraped from the
// agent after the event: before it every counter was 0, then it is at the
// scraped value. Each alert must fire for exactly the series whose counter
// moved, with their labels: the rules and the agent's metric names and
// labels agree, on real events.
func requireAlertsFire(t *testing.T, body []byte, alerts map[string]string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		// Not a skip: the caller's other checks still run.
		t.Log("promtool not installed (Debian package prometheus; CI installs it): alert firing not checked")
		return
	}
	data, err := os.ReadFile("../../deploy/prometheus/limits.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `yaml:"alert"`
				Expr   string            `yaml:"expr"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatalf("limits.yml: %v", err)
	}
	type rule struct {
		Alert  string            `json:"alert"`
		Expr   string            `json:"expr"`
		Labels map[string]string `json:"labels,omitempty"`
	}
	var rules []rule
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if _, ok := alerts[r.Alert]; ok {
				// Annotations left out: promtool compares them exactly,
				// and the expression and labels are what is checked.
				rules = append(rules, rule{r.Alert, r.Expr, r.Labels})
			}
		}
	}
	if len(rules) != len(alerts) {
		t.Fatalf("limits.yml has %d of the alerts %v", len(rules), alerts)
	}
	type expAlert struct {
		Labels map[string]string `json:"exp_labels"`
	}
	type alertTest struct {
		EvalTime  string     `json:"eval_time"`
		Alertname string     `json:"alertname"`
		ExpAlerts []expAlert `json:"exp_alerts"`
	}
	type series struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	var input []series
	var checks []alertTest
	for _, r := range rules {
		metric := alerts[r.Alert]
		samples := scrapedSeries(body, metric)
		keys := make([]string, 0, len(samples))
		for k := range samples {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		at := alertTest{EvalTime: "2m", Alertname: r.Alert, ExpAlerts: []expAlert{}}
		for _, k := range keys {
			v := samples[k]
			input = append(input, series{Series: k, Values: fmt.Sprintf("0 %g %g", v, v)})
			if v > 0 {
				labels := map[string]string{}
				for n, v := range r.Labels {
					labels[n] = v
				}
				for _, m := range labelRE.FindAllStringSubmatch(k, -1) {
					labels[m[1]] = m[2]
				}
				at.ExpAlerts = append(at.ExpAlerts, expAlert{labels})
			}
		}
		if len(at.ExpAlerts) == 0 {
			t.Fatalf("no %s moved in the scrape:\n%s", metric, grepLines(body, metric))
		}
		checks = append(checks, at)
	}
	dir := t.TempDir()
	rulesJSON, _ := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "scraped", "rules": rules}}})
	testJSON, _ := json.Marshal(map[string]any{
		"rule_files":          []string{"rules.yml"},
		"evaluation_interval": "1m",
		"tests":               []any{map[string]any{"interval": "1m", "input_series": input, "alert_rule_test": checks}},
	})
	// JSON is YAML.
	os.WriteFile(filepath.Join(dir, "rules.yml"), rulesJSON, 0o600)
	os.WriteFile(filepath.Join(dir, "test.yml"), testJSON, 0o600)
	out, err := exec.Command(promtool, "test", "rules", filepath.Join(dir, "test.yml")).CombinedOutput()
	if err != nil {
		t.Errorf("the alerts do not fire as expected on the agent's metrics: %v\n%s\ninput: %s", err, out, testJSON)
	}
}
