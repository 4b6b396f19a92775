/* Two feature lines for one id: gen_features.cmake must refuse this list. */
#define X86_FEATURE_FPU                 ( 0*32+ 0) /* "fpu" Onboard FPU */
#define X86_FEATURE_FPU_AGAIN           ( 0*32+ 0) /* "fpu_again" The same bit */
