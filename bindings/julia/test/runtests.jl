# Tests of the MemProbe Julia binding (untested here: no Julia toolchain
# where memprobe is built). Run with
#   MEMPROBE_LIBRARY=/path/libmemprobe.so julia --project=bindings/julia -e 'using Pkg; Pkg.test()'
using Test
using MemProbe
using MemProbe: MemprobeError, live_handles, info, version, soname

const MiB = 1 << 20

# A short RSS spike: touch n bytes, then drop them.
function spike(n)
    a = ones(UInt8, n)
    s = sum(a)
    a = nothing
    GC.gc()
    s
end

@testset "MemProbe" begin
    @testset "library" begin
        @test startswith(version(), "0.1.")
        @test soname() == "libmemprobe.so.0.1"
        @test b2mb(3MiB - 1) == 2
        @test b2mb(-3MiB) == -3
        @test b2mb(-1MiB + 1) == 0 && b2mb(typemin(Int64)) == -(1 << 43)
        @test MemProbe.status_name(MemProbe.WRONG_ORDER) != "unknown status"
        @test MemProbe.status_name(9999) == "unknown status"
    end

    @testset "sources" begin
        rss = Source(:process)
        s = read_sample(rss)
        @test s.used > 0
        @test s.total === nothing
        i = info(rss)
        @test i.kind === :process && i.fidelity === :exact
        ram = Source(:system_ram)
        r = read_sample(ram)
        @test r.total !== nothing && r.used <= r.total
        p = Source(:pushed, "alloc")
        push!(p, 5MiB)
        @test read_sample(p).used == 5MiB
        @test_throws MemprobeError push!(rss, 1)
        err = try
            push!(rss, 1)
        catch e
            e
        end
        @test err.status == MemProbe.UNSUPPORTED
        @test_throws MemprobeError Source(:pushed, "")
        c = Source("pool") do
            7MiB
        end
        @test read_sample(c).used == 7MiB
        close(p)
        close(p)
        @test_throws MemprobeError read_sample(p)
        foreach(close, (rss, ram, c))
        tp = Source(:tree_pss)
        tu = Source(:tree_uss)
        @test info(tp).kind === :process_tree_pss && info(tp).fidelity === :sampled
        @test info(tu).kind === :process_tree_uss
        @test read_sample(tp).used > 0 && read_sample(tu).used > 0
        foreach(close, (tp, tu))
    end

    @testset "windows" begin
        p = Source(:pushed, "p")
        push!(p, 100)
        Window(p) do w
            push!(p, 1000)
            push!(p, 300)
            d = measure(w)
            @test (d.used_start, d.used_end, d.peak) == (100, 300, 1000)
            @test d.delta_used == 200 && d.delta_peaked == 700
            ended = reset!(w)
            @test ended[1].peak == 1000
            @test peak(w) == 300
            @test length(w) == 1
            @test_throws MemprobeError peak(w, 2)
        end
        rss = Source(:process)
        w = Window(rss)
        start = measure(w).used_start
        spike(128MiB)
        @test peak(w) + 2MiB >= start + 128MiB
        close(w)
        close(w)
        @test_throws MemprobeError peak(w)
        close(rss)
        close(p)
    end

    @testset "traces" begin
        p = Source(:pushed, "p")
        push!(p, 10MiB)
        io = IOBuffer()
        t = Trace(p; ctx="foobar", io=io)
        push!(p, 110MiB)
        push!(p, 30MiB)
        @test data(t) == (20MiB, 80MiB)
        @test data_mb(t) == (20, 80)
        report(t, "1st try")
        @test endswith(strip(String(take!(io))), "(foobar: 1st try)")
        @test occursin("△Used Peaked MB:", format_report(t))
        stop!(t)
        @test_throws MemprobeError stop!(t)
        close(t)
        out = IOBuffer()
        withtrace(p; ctx="train", io=out) do
            push!(p, 33MiB)
        end
        @test endswith(strip(String(take!(out))), "(train: exit)")
        close(p)
    end

    @testset "monitor" begin
        monitor_set_interval(0.002)
        @test monitor_stats().interval_ns == 2_000_000
        @test_throws MemprobeError monitor_set_interval(0)
        monitor_set_interval(0.01)
        monitor_stop()
        @test !monitor_stats().running
    end

    @testset "tracker" begin
        p = Source(:pushed, "alloc")
        push!(p, 100MiB)
        t = Tracker(p)
        calls = Ref(0)
        MemProbe.add_release!(t, "cache") do
            calls[] += 1
            push!(p, 50MiB)
        end
        MemProbe.release_every!(t, :step, 2)
        seen = MemProbe.PhaseRecord[]
        MemProbe.add_callback_sink!(r -> push!(seen, r), t)
        begin_phase(t, :epoch)
        for i in 1:4
            begin_phase(t, :step)
            push!(p, 100MiB + i * MiB)
            end_phase(t, :step)
        end
        e = end_phase(t, :epoch)
        @test calls[] == 2
        @test e.kind === :epoch && e.deltas[1].peak == 104MiB
        @test length(seen) == 5
        @test_throws MemprobeError end_phase(t, :epoch)
        attempts = Ref(0)
        rep = MemProbe.run_oom_retry(t; max_retries=5) do
            attempts[] += 1
            attempts[] < 3 && throw(OutOfMemoryError())
            :done
        end
        @test rep.succeeded && rep.retries == 2 && rep.result === :done
        rep = MemProbe.run_oom_retry(t; max_retries=1) do
            throw(OutOfMemoryError())
        end
        @test !rep.succeeded && rep.retries == 1
        close(t)
        close(p)
    end

    @testset "out-of-memory report" begin
        p = Source(:pushed, "alloc")
        t = Tracker(p)
        @test_throws MemprobeError report_oom!(t, 0, 1 << 30)  # not configured
        dir = mktempdir()
        path = joinpath(dir, "oom.json")
        got = String[]
        set_oom_report!(t; path=path, keep_ended=2, callback=(j, s) -> push!(got, s))
        @test_throws MemprobeError set_oom_report!(t; path=path)  # configured twice
        @test_throws MemprobeError set_oom_report!(Tracker(p); path=path, driver=true)  # no interposer
        begin_phase(t, :epoch)
        begin_phase(t, :step)
        for i in 1:3
            push!(p, i * 1024MiB)
            push!(p, 512MiB)
            next_phase(t, :step)
        end
        push!(p, 7 * 1024MiB)
        report_oom!(t, 0, 2 << 30, "CUDA out of memory")
        report_oom!(t, 0, 2 << 30, "retry")
        st = oom_status(t)
        @test !st.armed && st.reports_written == 1 && st.later_triggers == 1
        @test length(got) == 1 && occursin("step #3", got[1])
        doc = read(path, String)
        @test occursin("\"kind\":\"step\",\"name\":\"step\",\"index\":3", doc)
        @test occursin("\"kept\":2,\"ended_total\":3", doc)
        rearm_oom_report!(t)
        @test occursin("\"later_triggers\":{\"count\":1,", read(path, String))
        report_oom!(t, 1, 1 << 30; reported_by="flux",
                    caches=[OomCache(1; reserved=4 << 30, allocated=3 << 30, releasable=1 << 30)])
        @test occursin("\"releasable_bytes\":1073741824", read(path, String))
        clear_oom_report!(t)
        @test_throws MemprobeError oom_status(t)
        close(t)
        close(p)
    end

    GC.gc()
    @test live_handles()[3] == 0
end

# GPUs: whatever this machine has, the fastai names never throw for "no GPU".
@testset "gpu" begin
    n = MemProbe.gpu_count()
    m = gpu_mem_get()
    if n == 0
        @test m == (total=0, free=0, used=0)
        @test gpu_mem_get_all() == []
        @test gpu_with_max_free_mem() == (nothing, 0)
    else
        @test m.total > 0
        d = GpuDevice(0)
        @test gpu_mem_get_used_fast(d) >= 0
        close(d)
        s = gpu_source(0)
        @test read_sample(s).total !== nothing
        close(s)
    end
end

@testset "exporter" begin
    e = Exporter()
    @test MemProbe.port(e) > 0
    p = Source(:pushed, "alloc")
    push!(p, 5 << 20)
    MemProbe.add_source!(e, p)
    MemProbe.set_rank!(e, 0, 0, 1)
    MemProbe.stop!(e)
    @test_throws MemprobeError MemProbe.stop!(e)
    close(e)
    close(p)
end

@testset "exporter with a web configuration" begin
    # bcrypt (cost 4) of "s3cret"; the Authorization value is base64 of "user:s3cret".
    hash = raw"$2b$04$DLse4tY1yMwulgkiUjPoOuY7.3QEz2D0lKkl1cubv8IH8v4FRjdf2"
    dir = mktempdir()
    web = joinpath(dir, "web.yml")
    write(web, "basic_auth_users:\n  user: '$hash'\n")
    e = Exporter(; web_config=web)
    @test MemProbe.port(e) > 0
    @test MemProbe.web_config_error(e) === nothing
    # A broken file while serving: refused and reported, not thrown.
    write(web * ".tmp", "basic_auth_users:\n  user: '$hash'\nbasic_auth_userz: {}\n")
    mv(web * ".tmp", web; force=true)
    err = nothing
    for _ in 1:200
        err = MemProbe.web_config_error(e)
        err === nothing || break
        sleep(0.05)
    end
    @test err isa MemprobeError
    @test occursin("basic_auth_userz", sprint(showerror, err))
    close(e)
    @test_throws MemprobeError Exporter(; web_config=joinpath(dir, "absent.yml"))
end
