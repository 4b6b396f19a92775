/* Two feature lines with one name: gen_features.cmake must refuse this list. */
#define X86_FEATURE_FPU                 ( 0*32+ 0) /* "fpu" Onboard FPU */
#define X86_FEATURE_OTHER               ( 0*32+ 1) /* "fpu" Another bit, the same name */
