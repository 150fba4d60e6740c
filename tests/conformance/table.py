"""What sojourn does with each test of cloudpickle's own suite (cloudpickle 2.2.1, pinned
in ``tests/thirdparty.py``), by test name (``Class::test`` or a module-level ``test``).

* ``passes``: every round trip of the test goes through sojourn (capture here, restore in a
  fresh interpreter of each version, capture there, restore here) and the test's own
  assertions hold. The test must make at least one round trip.
* ``refused``: sojourn refuses the capture by design, naming the object's path; the
  refusal must contain ``match``. Nothing comes back different: it does not come back.
* ``differs``: the round trips succeed on every version, and then the test asserts what
  only cloudpickle promises (``at`` is the assertion that fails, and it must be that one).
  Mostly cloudpickle's class tracking: a class it pickled by value and unpickles in the
  process that defined it is that very class; sojourn restores into another process, where
  no such class exists, and makes one.
* ``n/a``: the test is not run: it tests cloudpickle itself (its internals, its bytes, its
  child processes, protocol 2) and has no round trip through the helpers sojourn replaces.
* ``open``: a sojourn bug still open (the reason says what): the test must still fail, so
  that fixing it forces the table to say ``passes``.

A test of the suite that is not in this table fails the conformance test.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    kind: str  # passes | refused | differs | n/a | open
    reason: str = ""
    match: str = ""  # refused: a part of the refusal message
    at: str = ""  # differs: the statement whose assertion fails
    also_at: tuple[str, ...] = ()  # differs: where it fails in the replay, when elsewhere
    # Libraries the test's objects come from: where one is not installed, the restore there
    # must fail naming it (and the test with it).
    needs: tuple[str, ...] = ()
    # The test calls cloudpickle.dumps and pickle.loads itself: send those through sojourn too.
    direct: bool = False


PASSES = Entry("passes")


def refused(reason: str, match: str, direct: bool = False) -> Entry:
    return Entry("refused", reason, match=match, direct=direct)


def differs(reason: str, at: str, direct: bool = False, also_at: tuple[str, ...] = ()) -> Entry:
    return Entry("differs", reason, at=at, direct=direct, also_at=also_at)


DIRECT_PASSES = Entry("passes", direct=True)


def na(reason: str) -> Entry:
    return Entry("n/a", reason)


def open_bug(reason: str) -> Entry:
    return Entry("open", reason)


TRACKING = "cloudpickle's class tracking: the class pickled by value comes back as the very class in the process that defined it"
CHILD = "runs cloudpickle itself in a child interpreter (assert_run_python_script or subprocess_worker)"
DIRECT = "calls cloudpickle.dumps/loads itself, not the round-trip helpers"
INTERNALS = "tests a cloudpickle internal function or option"

TABLE: dict[str, Entry] = {
    # -- protocol 2: sojourn always writes protocol 5, so this class repeats the one below --
    "Protocol2CloudPickleTest": na("the same tests with pickle protocol 2; sojourn always writes protocol 5"),
    # -- module-level tests ---------------------------------------------------------------
    "test_extract_class_dict": na(INTERNALS),
    "test_lookup_module_and_qualname_dynamic_typevar": na(INTERNALS),
    "test_lookup_module_and_qualname_importable_typevar": na(INTERNALS),
    "test_lookup_module_and_qualname_stdlib_typevar": na(INTERNALS),
    "test_register_pickle_by_value": na(INTERNALS),
    "test_module_level_pickler": na(INTERNALS),
    # -- CloudPickleTest ------------------------------------------------------------------
    "CloudPickleTest::test_Ellipsis": PASSES,
    "CloudPickleTest::test_EllipsisType": PASSES,
    "CloudPickleTest::test_NamedTuple": differs(TRACKING, "assert isinstance(depickled_t1, MyTuple)"),
    "CloudPickleTest::test_NoneType": PASSES,
    "CloudPickleTest::test_NotImplemented": PASSES,
    "CloudPickleTest::test_NotImplementedType": PASSES,
    "CloudPickleTest::test___reduce___returns_string": PASSES,
    "CloudPickleTest::test_abc": PASSES,
    "CloudPickleTest::test_abc_cache_not_pickled": na(DIRECT),
    "CloudPickleTest::test_abstracts": PASSES,
    "CloudPickleTest::test_always_use_up_to_date_copyreg": PASSES,
    "CloudPickleTest::test_attrgetter": PASSES,
    "CloudPickleTest::test_bound_classmethod": PASSES,
    "CloudPickleTest::test_buffer": na("tests Python 2's buffer(); on Python 3 it does nothing"),
    "CloudPickleTest::test_builtin_classicmethod": PASSES,
    "CloudPickleTest::test_builtin_classmethod": PASSES,
    "CloudPickleTest::test_builtin_classmethod_descriptor": na("skipped by cloudpickle itself: CPython cannot pickle classmethod_descriptor"),
    "CloudPickleTest::test_builtin_function": PASSES,
    "CloudPickleTest::test_builtin_slotmethod": PASSES,
    "CloudPickleTest::test_builtin_staticmethod": PASSES,
    "CloudPickleTest::test_builtin_type_constructor": PASSES,
    "CloudPickleTest::test_cell_manipulation": na(DIRECT),
    "CloudPickleTest::test_class_annotations": PASSES,
    "CloudPickleTest::test_classmethod": PASSES,
    "CloudPickleTest::test_closure_interacting_with_a_global_variable": differs(
        "cloudpickle gives a function pickled by value globals of its own; sojourn gives a function of a module "
        "that module's globals (docs/design.md), so a later change to the module's global is seen",
        "assert cloned_f0.__globals__ is not f0.__globals__"),
    "CloudPickleTest::test_closure_none_is_preserved": PASSES,
    "CloudPickleTest::test_cloudpickle_extract_nested_globals": PASSES,
    "CloudPickleTest::test_correct_globals_import": na(DIRECT + " (and inspects its bytes)"),
    "CloudPickleTest::test_cycle_in_classdict_globals": PASSES,
    "CloudPickleTest::test_dataclass": PASSES,
    "CloudPickleTest::test_deterministic_pickle_bytes_for_function": na(DIRECT + " (and compares its bytes)"),
    "CloudPickleTest::test_dict_items": PASSES,
    "CloudPickleTest::test_dict_keys": PASSES,
    "CloudPickleTest::test_dict_values": PASSES,
    "CloudPickleTest::test_dynamic_module": refused("a module made at run time (types.ModuleType filled by exec) has no file and no name to import it by "
                    "on the destination, and the code exec() made has no source", "was made at run time"),
    "CloudPickleTest::test_dynamic_module_with_unpicklable_builtin": refused("a module made at run time (types.ModuleType filled by exec) has no file and no name to import it by "
                    "on the destination, and the code exec() made has no source", "was made at run time"),
    "CloudPickleTest::test_dynamic_pytest_module": na("skipped by cloudpickle itself: needs py.builtin"),
    "CloudPickleTest::test_dynamically_generated_class_that_uses_super": PASSES,
    "CloudPickleTest::test_empty_cell_preserved": PASSES,
    "CloudPickleTest::test_extended_arg": refused("code made by exec() from a string has no source to rebuild it from", "created by exec() or compile() from a string", direct=True),
    "CloudPickleTest::test_final_or_classvar_misdetection": PASSES,
    "CloudPickleTest::test_func_globals": DIRECT_PASSES,
    "CloudPickleTest::test_function_annotations": PASSES,
    "CloudPickleTest::test_function_module_name": PASSES,
    "CloudPickleTest::test_function_qualname": PASSES,
    "CloudPickleTest::test_generator": PASSES,
    "CloudPickleTest::test_generic_extensions_final": PASSES,
    "CloudPickleTest::test_generic_extensions_literal": PASSES,
    "CloudPickleTest::test_generic_subclass": differs(TRACKING, "assert pickle_depickle(klass, protocol=self.protocol) is klass"),
    "CloudPickleTest::test_generic_type": differs(TRACKING, "assert pickle_depickle(C, protocol=self.protocol) is C"),
    "CloudPickleTest::test_getset_descriptor": PASSES,
    "CloudPickleTest::test_import": na(CHILD),
    "CloudPickleTest::test_instance_with_slots": PASSES,
    "CloudPickleTest::test_instancemethods_without_self": PASSES,
    "CloudPickleTest::test_interactive_dynamic_type_and_remote_instances": na(CHILD),
    "CloudPickleTest::test_interactive_dynamic_type_and_stored_remote_instances": na(CHILD),
    "CloudPickleTest::test_interactive_remote_function_calls": na(CHILD),
    "CloudPickleTest::test_interactive_remote_function_calls_no_memory_leak": na(CHILD),
    "CloudPickleTest::test_interactive_remote_function_calls_no_side_effect": na(CHILD),
    "CloudPickleTest::test_interactively_defined_enum": na(CHILD),
    "CloudPickleTest::test_interactively_defined_func_with_keyword_only_argument": PASSES,
    "CloudPickleTest::test_interactively_defined_func_with_positional_only_argument": na(CHILD),
    "CloudPickleTest::test_interactively_defined_function": na(CHILD),
    "CloudPickleTest::test_interactively_defined_global_variable": na(CHILD),
    "CloudPickleTest::test_itemgetter": PASSES,
    "CloudPickleTest::test_itertools_count": PASSES,
    "CloudPickleTest::test_lambda": PASSES,
    "CloudPickleTest::test_large_memoryview": PASSES,
    "CloudPickleTest::test_literal_misdetection": PASSES,
    "CloudPickleTest::test_load_dynamic_module_in_grandchild_process": na(CHILD),
    "CloudPickleTest::test_load_namespace": DIRECT_PASSES,
    "CloudPickleTest::test_loads_namespace": DIRECT_PASSES,
    "CloudPickleTest::test_locally_defined_class_with_type_hints": na(CHILD),
    "CloudPickleTest::test_locally_defined_enum": differs(TRACKING, "assert green1 is Color.GREEN"),
    "CloudPickleTest::test_locally_defined_function_and_class": PASSES,
    "CloudPickleTest::test_locally_defined_intenum": differs(TRACKING, "assert ClonedDynamicColor is DynamicColor"),
    "CloudPickleTest::test_logger": PASSES,
    "CloudPickleTest::test_mappingproxy": PASSES,
    "CloudPickleTest::test_memoryview": PASSES,
    "CloudPickleTest::test_method_descriptors": PASSES,
    "CloudPickleTest::test_module": PASSES,
    "CloudPickleTest::test_module_importability": refused("a module made at run time (types.ModuleType filled by exec) has no file and no name to import it by "
                    "on the destination, and the code exec() made has no source", "was made at run time"),
    "CloudPickleTest::test_module_locals_behavior": na(CHILD),
    "CloudPickleTest::test_multiprocess": na(CHILD),
    "CloudPickleTest::test_multiprocessing_lock_raises": refused("a multiprocessing lock is shared by inheritance between processes; it is refused by path, not raised as cloudpickle's RuntimeError", "Lock objects should only be shared between processes through inheritance", direct=True),
    "CloudPickleTest::test_namedtuple": differs(TRACKING, "assert isinstance(depickled_t1, MyTuple)"),
    "CloudPickleTest::test_nested_lambdas": PASSES,
    "CloudPickleTest::test_non_module_object_passing_whichmodule_test": PASSES,
    "CloudPickleTest::test_odict_items": PASSES,
    "CloudPickleTest::test_odict_keys": PASSES,
    "CloudPickleTest::test_odict_values": PASSES,
    "CloudPickleTest::test_out_of_band_buffers": na(DIRECT + " (its buffer_callback)"),
    "CloudPickleTest::test_partial": PASSES,
    "CloudPickleTest::test_pickle_constructs_from_installed_packages_registered_for_pickling_by_value": na(INTERNALS),
    "CloudPickleTest::test_pickle_constructs_from_module_registered_for_pickling_by_value": na(INTERNALS),
    "CloudPickleTest::test_pickle_dynamic_typevar": PASSES,
    "CloudPickleTest::test_pickle_dynamic_typevar_memoization": PASSES,
    "CloudPickleTest::test_pickle_dynamic_typevar_tracking": differs(TRACKING, "assert T is T2"),
    "CloudPickleTest::test_pickle_importable_typevar": PASSES,
    "CloudPickleTest::test_pickle_reraise": refused("an object whose own pickling raises is refused by path (CaptureError), not with its own exception", "its own pickling fails: foo", direct=True),
    "CloudPickleTest::test_pickle_various_versions_of_the_same_function_with_different_pickling_method": na(INTERNALS),
    "CloudPickleTest::test_pickling_file_handles": DIRECT_PASSES,
    "CloudPickleTest::test_property": PASSES,
    "CloudPickleTest::test_recursion_during_pickling": refused("a pickling that calls itself without end is refused (CaptureError), not a PicklingError", "calls itself without end", direct=True),
    "CloudPickleTest::test_recursive_closure": PASSES,
    "CloudPickleTest::test_reducer_override_reference_cycle": DIRECT_PASSES,
    "CloudPickleTest::test_relative_import_inside_function": PASSES,
    "CloudPickleTest::test_sliced_and_non_contiguous_memoryview": PASSES,
    "CloudPickleTest::test_submodule": differs(
        "a function of a module gets that module's globals where it is restored, not copies: the program set "
        "`xml` at run time (`global xml` in a function) and deleted it after the capture, and the restore "
        "refuses, loudly, a function that no longer reaches the submodule it was captured with (in the replay, "
        "the fresh interpreter refuses it, at the round trip)",
        "f = pickle.loads(s)", direct=True, also_at=("s = cloudpickle.dumps(example, protocol=self.protocol)",)),
    "CloudPickleTest::test_submodule_closure": DIRECT_PASSES,
    "CloudPickleTest::test_tornado_coroutine": na(DIRECT + " (and needs tornado)"),
    "CloudPickleTest::test_type_hint": PASSES,
    "CloudPickleTest::test_ufunc": Entry("passes", needs=("scipy",)),
    "CloudPickleTest::test_unhashable_closure": PASSES,
    "CloudPickleTest::test_unhashable_function": PASSES,
    "CloudPickleTest::test_unrelated_faulty_module": PASSES,
    "CloudPickleTest::test_weakset_identity_preservation": PASSES,
    "CloudPickleTest::test_wraps_preserves_function_annotations": PASSES,
    "CloudPickleTest::test_wraps_preserves_function_doc": PASSES,
    "CloudPickleTest::test_wraps_preserves_function_name": PASSES,
}


def entry(nodeid: str) -> Entry | None:
    """The table's entry for a node id of the suite (``tests/cloudpickle_test.py::...``)."""
    name = nodeid.split(".py::", 1)[-1]
    if name in TABLE:
        return TABLE[name]
    return TABLE.get(name.split("::", 1)[0]) if "::" in name else None
