package driver

import (
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics is the driver's Prometheus registry: everything is read from the status board at
// scrape time (so the metrics, /v1/status and the live page always agree), except the
// rendezvous latency histogram, which the driver's loop observes.
type Metrics struct {
	Registry   *prometheus.Registry
	rendezvous prometheus.Histogram
}

// HostStates and WorkerStates are the states of HostStatus and WorkerStatus: the values of
// the state labels, all exported every scrape, and the keys of Status's counts by state.
var (
	HostStates   = []string{"active", "leaving", "blacklisted", "quarantined", "idle"}
	WorkerStates = []string{"running", "starting", "stopping"}
	phases       = []string{"starting", "running", "resetting", "waiting", "finishing", "done"}
)

// boardNames are the names of the metrics read from the board, as desc made them.
var boardNames []string

func desc(name, help string, labels ...string) *prometheus.Desc {
	boardNames = append(boardNames, "elasticd_"+name)
	return prometheus.NewDesc("elasticd_"+name, help, labels, nil)
}

// rendezvousMetric is the histogram's name.
const rendezvousMetric = "elasticd_rendezvous_seconds"

var (
	descJob          = desc("job_info", "The job: 1, labelled with its ID.", "job_id")
	descStart        = desc("job_start_time_seconds", "When the job began, in Unix seconds.")
	descPhase        = desc("phase", "1 for the job's current phase, 0 for the others.", "phase")
	descHosts        = desc("hosts", "Discovered hosts by state.", "state")
	descWorkers      = desc("workers", "Worker processes by state.", "state")
	descWorld        = desc("world_size", "Workers in the current generation.")
	descGeneration   = desc("generation", "The current generation (0 before the first).")
	descNP           = desc("np_limits", "The job's -np, --min-np and --max-np.", "limit")
	descResets       = desc("resets_total", "Completed resets by cause.", "cause")
	descStep         = desc("step", "The job's training step as rank 0 last reported it.")
	descCommitted    = desc("committed_step", "The step of the job's last commit.")
	descRate         = desc("steps_per_second", "Training steps per second over the last 10 s; 0 when not stepping.")
	descLoss         = desc("loss", "The training loss of rank 0's newest report that had one; absent while the program reports none.")
	descTotalSteps   = desc("total_steps", "The job's steps in all as the program reported them; 0 when unknown.")
	descRolledSteps  = desc("steps_rolled_back_total", "Training steps thrown away by restoring the last commit after failures.")
	descRolledGPUs   = desc("rolled_back_gpu_seconds_total", "Slot-seconds of work thrown away by rollbacks.")
	descNotices      = desc("notices_total", "Notices that a host goes away, by source and kind.", "provider", "kind")
	descInstanceSec  = desc("instance_seconds_total", "Instance time of the group's hosts, by lifecycle and instance type.", "lifecycle", "type")
	descCost         = desc("cost_total", "What the instance time cost, by lifecycle and type (priced types only).", "currency", "lifecycle", "type")
	descOnDemandEq   = desc("on_demand_equivalent_cost_total", "What the same instance time would have cost on demand (types with an on-demand price).", "currency")
	descSavings      = desc("savings", "On-demand equivalent minus what the instance time cost (a gauge: a spot price above on-demand lowers it).", "currency")
	descRolledBack   = desc("rolled_back_cost_total", "The cost of the work thrown away by rollbacks.", "currency")
	descUnpriced     = desc("unpriced_types", "Lifecycle and type pairs with no price, left out of the cost.")
	metricsCollected = []*prometheus.Desc{
		descJob, descStart, descPhase, descHosts, descWorkers, descWorld, descGeneration, descNP, descResets,
		descStep, descCommitted, descRate, descLoss, descTotalSteps, descRolledSteps, descRolledGPUs, descNotices,
		descInstanceSec, descCost, descOnDemandEq, descSavings, descRolledBack, descUnpriced,
	}
)

// NewMetrics returns the registry over board, with the Go runtime and process collectors.
func NewMetrics(board *StatusBoard) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		rendezvous: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: rendezvousMetric,
			Help: "From training stopping (a reset beginning, or the job starting) to every worker of the next generation registered.",
			// From a reset among survivors on one machine (milliseconds) to cold starts of
			// large images on fresh spot hosts (minutes).
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}),
	}
	m.Registry.MustRegister(m.rendezvous, boardCollector{board},
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// Names returns the name of every series the registry exports (a histogram's _bucket, _sum
// and _count), whether or not it has a value yet: what a dashboard may query.
func (m *Metrics) Names() []string {
	names := map[string]bool{}
	for _, n := range boardNames {
		names[n] = true
	}
	mfs, err := m.Registry.Gather() // the histogram, the Go runtime and process collectors
	if err != nil {
		panic(err) // the collectors are ours and fixed: cannot happen
	}
	for _, mf := range mfs {
		n := mf.GetName()
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[n], names[n+"_sum"], names[n+"_count"] = true, true, true
		default:
			names[n] = true
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// ObserveRendezvous records one completed rendezvous.
func (m *Metrics) ObserveRendezvous(d time.Duration) { m.rendezvous.Observe(d.Seconds()) }

type boardCollector struct{ b *StatusBoard }

func (c boardCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range metricsCollected {
		ch <- d
	}
}

func (c boardCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.b.Current(c.b.clock())
	if s == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(descJob, 1, s.JobID)
	if !s.StartedAt.IsZero() {
		gauge(descStart, float64(s.StartedAt.UnixNano())/1e9)
	}
	for _, p := range phases {
		gauge(descPhase, b2f(s.Phase == p), p)
	}
	hosts := map[string]int{}
	for _, h := range s.Hosts {
		hosts[h.State]++
	}
	for _, st := range HostStates {
		gauge(descHosts, float64(hosts[st]), st)
	}
	workers := map[string]int{}
	for _, w := range s.Workers {
		workers[w.State]++
	}
	for _, st := range WorkerStates {
		gauge(descWorkers, float64(workers[st]), st)
	}
	gauge(descWorld, float64(s.WorldSize))
	gauge(descGeneration, float64(s.Generation))
	gauge(descNP, float64(s.NP), "np")
	gauge(descNP, float64(s.MinNP), "min")
	gauge(descNP, float64(s.MaxNP), "max")
	for _, cause := range ResetCauses {
		counter(descResets, float64(s.ResetsByCause[cause]), cause)
	}
	gauge(descStep, float64(s.Progress.Step))
	gauge(descCommitted, float64(s.Progress.CommittedStep))
	gauge(descRate, s.Progress.StepsPerSecond)
	if s.Progress.Loss != nil {
		gauge(descLoss, *s.Progress.Loss)
	}
	gauge(descTotalSteps, float64(s.Progress.TotalSteps))
	counter(descRolledSteps, float64(s.Progress.RolledBackSteps))
	counter(descRolledGPUs, s.Progress.RolledBackGPUs)
	for _, n := range s.Notices {
		counter(descNotices, float64(n.Count), n.Provider, n.Kind)
	}
	cs := s.Cost
	for _, l := range cs.Lines {
		counter(descInstanceSec, l.Seconds, l.Lifecycle, l.Type)
		if l.Cost != nil {
			counter(descCost, *l.Cost, cs.Currency, l.Lifecycle, l.Type)
		}
	}
	counter(descOnDemandEq, cs.OnDemandEquivalent, cs.Currency)
	gauge(descSavings, cs.Savings, cs.Currency)
	counter(descRolledBack, cs.RolledBack, cs.Currency)
	gauge(descUnpriced, float64(len(cs.Unpriced)))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
